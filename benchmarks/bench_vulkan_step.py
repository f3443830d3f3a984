"""Where a Vulkan decode step's time goes: the plan's replay (submit + GPU + wait), staging transfers, and
the host's Python around them.

    python benchmarks/bench_vulkan_step.py MODEL.gguf [--steps 64] [--staged] [--every-barrier] [--no-fuse]

Decodes a 32-token prompt, then times --steps single-token steps (after 8 warm-up steps), with the
device calls counted and timed by wrapping them: VulkanPlan.__call__ (one submit of the recorded
command buffer and the fence wait: the GPU's share), Staging transfers (a submit each, where device
memory is not host-visible), and everything else (the scheduler, inputs, logits). Also the cost of one
empty submit-and-wait, the dispatches a step records, and the GPU's time per kind of dispatch (the step's
dispatches recorded again with a timestamp after each: kernel plus barrier). --staged forces the staging path
(DeviceBuffer.map_when_possible off) to show on an integrated GPU or lavapipe what a discrete GPU without
resizable BAR does; --every-barrier records a barrier before every dispatch (VulkanPlan.elide_barriers off);
--no-fuse runs one dispatch per node (VulkanBackend.fuse off).
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from ggflow.backends_builtin.vulkan import VulkanBackend, buffers, plan
from ggflow.backends_builtin.vulkan.device import get_device
from ggflow.core.batch import Batch
from ggflow.core.context import Context
from ggflow.core.model import Model
from vulkan_timestamps import gpu_seconds_per_dispatch

SPENT: dict[str, list[float]] = defaultdict(list)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name].append(time.perf_counter() - t0)
    return wrapper


def gpu_times_by_kind(device, plans: list[plan.VulkanPlan]) -> dict[str, float]:
    """Seconds of GPU time per pipeline name over one replay of the plans."""
    by_kind: dict[str, float] = defaultdict(float)
    for d, seconds in gpu_seconds_per_dispatch(device, plans):
        by_kind[d.pipeline.name] += seconds
    return dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--staged", action="store_true")
    parser.add_argument("--every-barrier", action="store_true")
    parser.add_argument("--no-fuse", action="store_true")
    args = parser.parse_args()
    if args.no_fuse:
        VulkanBackend.fuse = False
    if args.staged:
        buffers.DeviceBuffer.map_when_possible = False
    if args.every_barrier:
        plan.VulkanPlan.elide_barriers = False
    device = get_device()
    ctx = Context(Model.load(args.model), n_ctx=512, backends=["vulkan"])
    prompt = list(range(10, 42))
    ctx.decode(Batch.from_tokens(prompt))
    pos = len(prompt)
    for _ in range(8):
        ctx.decode(Batch.from_tokens([7], pos0=pos))
        pos += 1
    plan.VulkanPlan.__call__ = timed("plan replay", plan.VulkanPlan.__call__)
    buffers.Staging._copy = timed("staging copy", buffers.Staging._copy)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        ctx.decode(Batch.from_tokens([7], pos0=pos))
        ctx.get_logits()
        steps.append(time.perf_counter() - t0)
        pos += 1
    empty = []
    for _ in range(32):
        t0 = time.perf_counter()
        device.run_once(lambda cmd: None)
        empty.append(time.perf_counter() - t0)
    plans = [s.plan for s in ctx.scheduler.splits if s.backend.name == "vulkan" and s.plan is not None]
    dispatches, barriers = sum(len(p) for p in plans), sum(p.n_barriers for p in plans)
    n = args.steps
    step = float(np.median(steps)) * 1e3
    print(f"device: {device.info.name}; model {args.model.name}; {'staged' if args.staged else 'mapped when possible'}"
          f"{'; every barrier' if args.every_barrier else ''}{'; unfused' if args.no_fuse else ''}")
    print(f"decode step: median {step:.3f} ms ({1e3 / step:.1f} tok/s), {dispatches} dispatches and {barriers} "
          "barriers recorded")
    accounted = 0.0
    for name, times in SPENT.items():
        per_step = sum(times) / n * 1e3
        accounted += per_step
        print(f"  {name:>13}: {len(times) / n:5.1f} a step, {per_step:.3f} ms a step "
              f"(median {np.median(times) * 1e3:.3f} ms each)")
    print(f"  {'the rest':>13}: {float(np.mean(steps)) * 1e3 - accounted:.3f} ms a step (host Python)")
    print(f"empty submit + wait: median {np.median(empty) * 1e3:.3f} ms")
    kinds = gpu_times_by_kind(device, plans)
    counts: dict[str, int] = defaultdict(int)
    for p in plans:
        for d in p.dispatches:
            counts[d.pipeline.name] += 1
    print(f"GPU time of the step's dispatches, timestamped one by one: {sum(kinds.values()) * 1e3:.3f} ms")
    for name, seconds in kinds.items():
        print(f"  {name:>24}: {counts[name]:4d} dispatches, {seconds * 1e3:7.3f} ms "
              f"({seconds / counts[name] * 1e6:6.1f} us each)")


if __name__ == "__main__":
    main()
