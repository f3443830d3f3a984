"""Speed of the Vulkan backend's kernels: mul_mat per weight type, and one elementwise op.

    python benchmarks/bench_vulkan.py [--types Q4_0 Q4_K ...] [--rows 4096] [--k 4096] [--batch 64]
    GGFLOW_VULKAN_DEVICE=1 python benchmarks/bench_vulkan.py      # another device

For every weight type: a matvec (1 column: decode) and a tiled matmul (--batch columns: a prompt), in
GB/s of the weight's GGUF bytes and GFLOP/s (2 * n * rows * k / time), the time being the GPU's (its
dispatches timestamped, vulkan_timestamps.py: the activations' rounding pass included); the last column
is a replay of the compiled plan timed from the host (one submit and fence wait, as a decode step does).
"F16 inline" is F16 with b rounded as the kernel reads it (ops_matmul.PREROUND_F16_WEIGHTS off). Whole-model
speed is `ggflow bench --backend vulkan`. On lavapipe (Mesa's CPU driver) these are software-driver
figures, far from a GPU's.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ggflow
from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.backends_builtin.vulkan import VulkanBackend, ops_matmul
from ggflow.core import ops
from ggflow.core.graph import Graph
from ggflow.core.scheduler import Scheduler
from ggflow.core.tensor import TensorFlag
from ggflow.core.types import type_traits
from vulkan_timestamps import gpu_seconds_per_dispatch

ALL_TYPES = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def weight_bytes(w_type: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    base = rng.standard_normal((min(rows, 256), k)).astype(np.float32)
    data = base.astype(np.float16) if w_type == "F16" else base if w_type == "F32" else ggflow.quantize(base, w_type)
    return np.ascontiguousarray(np.tile(data, (-(-rows // data.shape[0]), 1))[:rows])


def plan_for(backend: VulkanBackend, outputs, inputs: dict) -> tuple[Scheduler, Graph]:
    graph = Graph(outputs)
    sched = Scheduler([backend, CPUBackend()])
    sched.alloc(graph)
    for tensor, data in inputs.items():
        sched.set_input(tensor, data)
    if any(s.backend.name != "vulkan" for s in sched.splits):
        raise SystemExit("a node fell back to the CPU: this would time the CPU")
    return sched, graph


def seconds(sched: Scheduler, graph: Graph, repeats: int) -> tuple[float, float]:
    """(GPU seconds of the plan's dispatches, host seconds of a replay), medians."""
    sched.compute(graph)   # warm-up: pipelines compile on first use
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sched.compute(graph)
        times.append(time.perf_counter() - t0)
    plans = [s.plan for s in sched.splits if s.plan is not None]
    gpu = sum(t for _, t in gpu_seconds_per_dispatch(sched.splits[0].backend.device, plans, repeats))
    return gpu, float(np.median(times))


def bench_matmul(backend, w_type: str, rows: int, k: int, n: int, repeats: int, rng):
    """GB/s and GFLOP/s on the GPU's time, and the host's time of a replay in us."""
    w = ops.new_input(type_traits(w_type), (k, rows), "w")
    w.flags |= TensorFlag.PARAM   # a model's weight (F16 weights then round b ahead)
    x = ops.new_input("F32", (k, n), "x")
    sched, graph = plan_for(backend, [ops.mul_mat(w, x)], {w: weight_bytes(w_type, rows, k, rng),
                                                           x: rng.standard_normal((n, k)).astype(np.float32)})
    gpu, wall = seconds(sched, graph, repeats)
    return w.nbytes / gpu / 1e9, 2 * n * rows * k / gpu / 1e9, wall * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="*", default=ALL_TYPES)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    backend = VulkanBackend()
    rng = np.random.default_rng(0)
    print(f"device: {backend.device.info.name} ({backend.device.info.kind}); {args.rows} x {args.k} weights")
    print(f"| {'type':>10} | {'matvec GB/s':>11} | {'matvec GFLOP/s':>14} | {f'mm{args.batch} GFLOP/s':>14} "
          f"| {'matvec replay us':>16} |")
    print(f"| {'-' * 10} | {'-' * 11} | {'-' * 14} | {'-' * 14} | {'-' * 16} |")
    rows = [(t, t) for t in args.types] + ([("F16 inline", "F16")] if "F16" in args.types else [])
    for label, w_type in rows:
        ops_matmul.PREROUND_F16_WEIGHTS = label != "F16 inline"
        gbs, vec_flops, wall = bench_matmul(backend, w_type, args.rows, args.k, 1, args.repeats, rng)
        _, mm_flops, _ = bench_matmul(backend, w_type, args.rows, args.k, args.batch, args.repeats, rng)
        print(f"| {label:>10} | {gbs:11.2f} | {vec_flops:14.2f} | {mm_flops:14.2f} | {wall:16.1f} |")
    ops_matmul.PREROUND_F16_WEIGHTS = True
    n = args.rows * args.k
    a = ops.new_input("F32", (args.k, args.rows), "a")
    sched, graph = plan_for(backend, [ops.silu(a)], {a: rng.standard_normal(n).astype(np.float32)})
    print(f"silu over {n} floats: {n * 8 / seconds(sched, graph, args.repeats)[0] / 1e9:.2f} GB/s (read + write)")


if __name__ == "__main__":
    main()
