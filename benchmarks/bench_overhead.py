"""Python overhead per decode step with the graph reused, on a SmolLM2-shaped graph with tiny tensors.

A 30-layer llama with 64-wide layers has SmolLM2's graph (same nodes, same count) but kernels that take
microseconds, so the time of a decode step is almost all Python: input setting, plan dispatch, logits copy.
    python benchmarks/bench_overhead.py [--layers 30] [--steps 200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    args = ap.parse_args()
    spec = tiny_models.TinySpec("llama", 64, 4, 2, args.layers, 64, 2048)
    tiny_models.SPECS["llama-overhead"] = spec
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "overhead.gguf"
        tiny_models.SPECS["llama"], saved = spec, tiny_models.SPECS["llama"]
        try:
            tiny_models.write_tiny_model(path, "llama")
        finally:
            tiny_models.SPECS["llama"] = saved
        model = Model.load(path)
        ctx = Context(model, n_ctx=1024, backends="cpu", n_threads=args.threads)
        ctx.decode(Batch.from_tokens([1, 2, 3, 4]))
        times = []
        for pos in range(4, 4 + args.steps):
            t0 = time.perf_counter()
            ctx.decode(Batch.from_tokens([5], pos0=pos))
            times.append(time.perf_counter() - t0)
        graph = ctx._built.graph
        print(f"{args.layers} layers, {len(graph.nodes)} graph nodes, {ctx.n_graph_reuses} reuses: "
              f"median {1e3 * statistics.median(times[20:]):.3f} ms per decode step "
              f"({1e6 * statistics.median(times[20:]) / len(graph.nodes):.2f} us per node)")


if __name__ == "__main__":
    main()
