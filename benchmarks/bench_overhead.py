"""Python overhead per decode step with the graph reused, on a SmolLM2-shaped graph with tiny tensors.

A 30-layer llama with 64-wide layers has SmolLM2's graph (same nodes, same count) but kernels that take
microseconds, so the time of a decode step is almost all Python: input setting, plan dispatch, logits copy.
``plan`` is the compiled plan alone (the kernels' calls), ``step`` the whole Context.decode; ``--by-kernel``
adds each kernel's time alone, summed by kind; ``--generate`` also times ``LLM.generate`` per token on the same
model (the whole generation loop: engine step, sampling, stream decoder) and prints what it adds to a step.
    python benchmarks/bench_overhead.py [--layers 30] [--steps 200] [--weight-type Q4_1] [--no-fuse] [--by-kernel]
                                        [--generate]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggflow.core.batch import Batch  # noqa: E402
from ggflow.core.context import Context  # noqa: E402
from ggflow.core.model import Model  # noqa: E402
from tests.fixtures import tiny_models  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--weight-type", default="F32", help="type of the 2-D weights (the default model: Q4_1)")
    ap.add_argument("--no-fuse", action="store_true", help="one kernel per node (CPUBackend.fuse off)")
    ap.add_argument("--by-kernel", action="store_true",
                    help="also time each of the plan's kernels alone and print their medians by kind")
    ap.add_argument("--generate", action="store_true",
                    help="also time LLM.generate per token (greedy, end of text banned) on the same model")
    args = ap.parse_args()
    spec = tiny_models.TinySpec("llama", 64, 4, 2, args.layers, 64, 2048)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "overhead.gguf"
        tiny_models.SPECS["llama"], saved = spec, tiny_models.SPECS["llama"]
        try:
            tiny_models.write_tiny_model(path, "llama", args.weight_type)
        finally:
            tiny_models.SPECS["llama"] = saved
        model = Model.load(path)
        ctx = Context(model, n_ctx=1024, backends="cpu", n_threads=args.threads)
        if args.no_fuse:
            ctx.backends[-1].fuse = False
        ctx.decode(Batch.from_tokens([1, 2, 3, 4]))
        steps, plans = [], []
        for pos in range(4, 4 + args.steps):
            t0 = time.perf_counter()
            ctx.decode(Batch.from_tokens([5], pos0=pos))
            steps.append(time.perf_counter() - t0)
            plan = ctx.scheduler.splits[0].plan
            t0 = time.perf_counter()
            plan()   # the same step's kernels again: same inputs, same results
            plans.append(time.perf_counter() - t0)
        graph = next(reversed(ctx._graphs.values())).graph   # the decode step's: the last one used
        n_kernels = len(getattr(plan, "kernels", ()))
        step, plan_ms = 1e3 * statistics.median(steps[20:]), 1e3 * statistics.median(plans[20:])
        print(f"{args.layers} layers, {args.weight_type} weights, {len(graph.nodes)} graph nodes, {n_kernels} kernels, "
              f"{ctx.n_graph_reuses} reuses: median {step:.3f} ms per decode step, plan {plan_ms:.3f} ms "
              f"({1e3 * step / len(graph.nodes):.2f} us per node)")
        if args.by_kernel:
            by_kernel(plan)
        if args.generate:
            per_token = generate_per_token(path, args.steps, args.threads)
            print(f"LLM.generate: median {per_token:.3f} ms per token, {per_token - step:.3f} ms over a decode step")


def generate_per_token(path: Path, steps: int, threads: int, rounds: int = 5) -> float:
    """The median over rounds of (generation time / tokens) of a greedy LLM.generate of ``steps`` tokens."""
    from ggflow.api import LLM

    llm = LLM(str(path), n_ctx=1024, backend="cpu", n_threads=threads)
    ban = {t: float("-inf") for t in range(llm.n_vocab()) if llm.vocab.is_eog(t)}
    times = []
    for r in range(rounds + 1):
        llm.reset()
        out = llm.generate([1, 2, 3, 4], max_tokens=steps, temperature=0, logit_bias=ban)
        if r:   # the first round compiles and builds the graphs
            times.append(out.timings.predicted_ms / max(out.timings.predicted_n - 1, 1))
    return statistics.median(times)


def by_kernel(plan, rounds: int = 200) -> None:
    """Each kernel of the plan timed alone, rounds times (the first tenth dropped), medians summed by kind (the
    bound function's name): where a step's plan goes."""
    kernels = plan.kernels
    seconds = np.zeros((rounds, len(kernels)))
    clock = time.perf_counter
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(rounds):
            for j, kernel in enumerate(kernels):
                t0 = clock()
                kernel()
                seconds[r, j] = clock() - t0
    medians = np.median(seconds[rounds // 10:], axis=0)
    kinds: dict[str, list[float]] = {}
    for kernel, median in zip(kernels, medians):
        name = getattr(getattr(kernel, "func", kernel), "__qualname__", type(kernel).__name__)
        kinds.setdefault(name, []).append(median)
    print(f"kernels alone: {1e3 * medians.sum():.3f} ms in all")
    for name, times in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        print(f"{1e6 * sum(times):9.1f} us  {len(times):4d} x {1e6 * sum(times) / len(times):6.2f} us  {name}")


if __name__ == "__main__":
    main()
