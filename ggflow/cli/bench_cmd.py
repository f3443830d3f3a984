"""``ggflow bench``: prompt processing and generation speed, as llama-bench reports them, plus peak RSS."""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

from ggflow.cli.args import int_at_least
from ggflow.cli.common import KV_TYPES, backend_names, model_path
from ggflow.process_heap import freeze_loaded_objects


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="measure prompt-processing and generation speed",
                                   description="llama-bench style: pp<N> and tg<N> tokens/s (mean and stddev "
                                               "over repetitions, after a warm-up run) and peak RSS.")
    parser.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("-p", "--n-prompt", type=int_at_least(0, "0: skip"), default=64,
                        help="prompt tokens per pp test (0: skip)")
    parser.add_argument("-n", "--n-gen", type=int_at_least(0, "0: skip"), default=32,
                        help="generated tokens per tg test (0: skip)")
    parser.add_argument("-d", "--n-depth", type=int_at_least(0), default=0,
                        help="tokens already in the KV cache when each test runs (llama-bench's -d)")
    parser.add_argument("-r", "--repetitions", type=int_at_least(1), default=3)
    parser.add_argument("-t", "--threads", type=int_at_least(1), default=None)
    parser.add_argument("--backend", default="cpu", help="backend name(s), comma separated (default: cpu)")
    parser.add_argument("--cache-type-k", type=str.upper, choices=KV_TYPES, default="F16")
    parser.add_argument("--cache-type-v", type=str.upper, choices=KV_TYPES, default="F16")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run, compiles_kernels=True)


def run(args: argparse.Namespace) -> int:
    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model

    path = model_path(args)
    model = Model.load(path)
    depth = args.n_depth
    n_ctx = max(256, depth + args.n_prompt + args.n_gen + 1)
    ctx = Context(model, n_ctx=n_ctx, backends=backend_names(args.backend), n_threads=args.threads,
                  type_k=args.cache_type_k, type_v=args.cache_type_v)
    freeze_loaded_objects()
    rng = np.random.default_rng(0)

    def at_depth() -> None:
        """The cache holding ``depth`` tokens, and nothing after them: filled once, trimmed for each run."""
        if depth and ctx.memory.seq_pos_max(0) >= depth - 1:
            ctx.memory.seq_rm(0, depth, -1)
            return
        ctx.clear()
        if depth:
            ctx.decode(Batch.from_tokens(rng.integers(0, model.hparams.n_vocab, depth)))

    def pp() -> float:
        at_depth()
        tokens = rng.integers(0, model.hparams.n_vocab, args.n_prompt)
        t0 = time.perf_counter()
        ctx.decode(Batch.from_tokens(tokens, pos0=depth))
        return args.n_prompt / (time.perf_counter() - t0)

    def tg() -> float:
        at_depth()
        token = int(rng.integers(0, model.hparams.n_vocab))
        t0 = time.perf_counter()
        for pos in range(depth, depth + args.n_gen):
            ctx.decode(Batch.from_tokens([token], pos0=pos))
        return args.n_gen / (time.perf_counter() - t0)

    from ggflow.backends_builtin.cpu import spare_cores
    spare_cores.plans_by_threads.clear()
    results = []
    for name, n, test in (("pp", args.n_prompt, pp), ("tg", args.n_gen, tg)):
        if n <= 0:
            continue
        test()  # warm-up: compiles kernels, packs weights, builds the graph
        speeds = [test() for _ in range(max(1, args.repetitions))]
        label = f"{name}{n}" + (f" @ d{depth}" if depth else "")      # llama-bench's names
        results.append({"test": label, "tokens_per_second": statistics.mean(speeds),
                        "stddev": statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
                        "median": statistics.median(speeds), "runs": speeds})
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the part of the file still mapped in: weights packed into a copy have given their pages back
    mapped = model.file.resident_bytes()
    info = {"model": path.rsplit("/", 1)[-1], "size_mb": model.size_bytes / 2**20,
            "model_mapped_mb": None if mapped is None else mapped / 2**20,
            "params_m": model.n_params / 1e6, "backend": ",".join(b.name for b in ctx.backends),
            "threads": args.threads, "kv_cache_mb": ctx.memory.nbytes / 2**20, "peak_rss_mb": peak_rss_mb,
            # the CPU backend runs a plan on the cores other processes leave free (spare_cores.py): how many
            # CPU plan runs used how many threads, so that a busy machine's -t 2 shows as what it was
            "cpu_plans_by_threads": {str(k): v for k, v in sorted(spare_cores.plans_by_threads.items())},
            "results": results}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"model: {info['model']} ({info['size_mb']:.1f} MiB, {info['params_m']:.1f} M params), "
          f"backend: {info['backend']}, threads: {args.threads or 'all'}")
    width = max([8] + [len(r["test"]) for r in results])
    print(f"| {'test':>{width}} | {'t/s':>18} |")
    print(f"| {'-' * width} | {'-' * 18} |")
    for r in results:
        print(f"| {r['test']:>{width}} | {r['tokens_per_second']:8.2f} ± {r['stddev']:7.2f} |")
    plans = info["cpu_plans_by_threads"]
    if len(plans) > 1 or (args.threads and plans and max(map(int, plans)) < args.threads):
        print("CPU plans ran on " + ", ".join(f"{k} thread(s) x{v}" for k, v in plans.items())
              + ": other processes kept cores busy (GGFLOW_FOLLOW_LOAD=0 keeps every thread)", file=sys.stderr)
    in_rss = "" if mapped is None else f", {info['model_mapped_mb']:.0f} MiB of it mapped at the end"
    print(f"peak RSS: {peak_rss_mb:.0f} MiB (model file {info['size_mb']:.0f} MiB{in_rss}, KV cache "
          f"{info['kv_cache_mb']:.1f} MiB)", file=sys.stderr)
    return 0
