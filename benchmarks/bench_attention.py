"""Decode steps with attention as one fused chain (ops/attention.py) against the three unfused kernels.

One process, one model, two contexts: the same decode step (``--sequences`` sequences with ``--context``
cached tokens each, one new token each) with the fused attention and with it declined (the plan's other
fused chains kept), interleaved step by step; medians of ``--steps``. Both give the same bits (tests/
test_cpu_attention.py); this is what the fusion is worth in time.

    python benchmarks/bench_attention.py [-m MODEL] [--sequences 1 4] [--context 150 500] [-t 1] [--steps 60]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggflow.api import default_model_path  # noqa: E402
from ggflow.backends_builtin.cpu.ops import attention_pages  # noqa: E402
from ggflow.core.batch import Batch  # noqa: E402
from ggflow.core.context import Context  # noqa: E402
from ggflow.core.model import Model  # noqa: E402

_real_chains = attention_pages.attention_chains
_fusing = {"on": True}
# The CPU backend looks attention_chains up when it compiles a plan: declined while the unfused context runs.
attention_pages.attention_chains = lambda nodes: _real_chains(nodes) if _fusing["on"] else {}


def stepper(model: Model, fused: bool, n_seq: int, n_cached: int, threads: int):
    """A function that runs one decode step of n_seq sequences, each n_cached tokens in, on its own context."""
    _fusing["on"] = fused
    ctx = Context(model, n_ctx=max(4096, n_seq * (n_cached + 512)), backends="cpu", n_threads=threads)
    rng = np.random.default_rng(0)
    vocab = min(40000, model.hparams.n_vocab)      # any token ids the model has
    for s in range(n_seq):
        last = np.arange(n_cached) == n_cached - 1
        ctx.decode(Batch(rng.integers(100, vocab, n_cached), np.arange(n_cached), s, last))
    pos = [n_cached]

    def step() -> float:
        _fusing["on"] = fused
        batch = Batch(rng.integers(100, vocab, n_seq), np.full(n_seq, pos[0]), np.arange(n_seq), np.ones(n_seq, bool))
        pos[0] += 1
        start = time.perf_counter()
        ctx.decode(batch)
        return time.perf_counter() - start
    step(), step()     # compile and warm
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--sequences", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--context", type=int, nargs="+", default=[150, 500])
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    model = Model.load(args.model or default_model_path())
    print("| sequences | cached tokens each | fused ms/step | unfused ms/step | unfused / fused |")
    print("|---|---|---|---|---|")
    for n_seq in args.sequences:
        for n_cached in args.context:
            fused, unfused = (stepper(model, f, n_seq, n_cached, args.threads) for f in (True, False))
            times = {True: [], False: []}
            for i in range(args.steps):
                for way, run in ((True, fused), (False, unfused))[:: 1 if i % 2 else -1]:
                    times[way].append(run())
            a, b = (1e3 * statistics.median(times[w]) for w in (True, False))
            print(f"| {n_seq} | {n_cached} | {a:.2f} | {b:.2f} | {b / a:.3f} |", flush=True)


if __name__ == "__main__":
    main()
