"""Helpers for the Vulkan tests: skip without a driver, run a graph on Vulkan (+ CPU) and on the CPU alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.backends_builtin.vulkan import VulkanBackend
from ggflow.core.backend import HostBuffer
from ggflow.core.graph import Graph
from ggflow.core.scheduler import Scheduler
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.core.types import type_traits

AVAILABILITY = VulkanBackend.is_available()
requires_vulkan = pytest.mark.skipif(not AVAILABILITY, reason=f"no Vulkan device: {AVAILABILITY.reason}")

# build() -> ({input name: tensor}, [outputs]); a fresh graph per run, as tensors keep their memory.
Build = Callable[[], "tuple[dict[str, Tensor], list[Tensor]]"]


@dataclass
class Run:
    outputs: list[np.ndarray]
    scheduler: Scheduler

    def ops_on(self, backend_name: str) -> list[str]:
        return [n.op for s in self.scheduler.splits if s.backend.name == backend_name for n in s.nodes]


def weight(type_name: str, data: np.ndarray, name: str = "w") -> Tensor:
    """A model weight: a PARAM leaf in host memory (data: numpy order; bytes for quantized types), as a
    GGUF file's are. The CPU then multiplies it with its packed kernels (ggml's numerics), and a Vulkan
    run adopts it as a Context would."""
    traits = type_traits(type_name)
    rows = data.reshape(-1, data.shape[-1])
    ne0 = rows.shape[1] if not traits.is_quantized else rows.shape[1] // traits.type_size * traits.block_size
    t = Tensor(traits, (ne0, rows.shape[0]), name=name, flags=TensorFlag.PARAM)
    raw = np.ascontiguousarray(data.astype(traits.numpy_dtype) if traits.numpy_dtype is not None else data)
    t.buffer, t.offset = HostBuffer(raw.reshape(-1).view(np.uint8).copy()), 0
    return t


def run_graph(build: Build, inputs: dict[str, np.ndarray], backends: list) -> Run:
    tensors, outs = build()
    graph = Graph(outs)
    params = {t.name: t for t in graph.leafs if t.flags & TensorFlag.PARAM and t.buffer is not None}
    backends[0].adopt_weights(params)   # as Context does
    sched = Scheduler(backends)
    sched.alloc(graph)
    for name, t in tensors.items():
        sched.set_input(t, inputs[name])
    sched.compute(graph)
    return Run([sched.get_output(o) for o in outs], sched)


_vulkan: VulkanBackend | None = None


def vulkan() -> VulkanBackend:
    global _vulkan
    if _vulkan is None:
        _vulkan = VulkanBackend()
    return _vulkan


def on_vulkan_and_cpu(build: Build, inputs: dict[str, np.ndarray]) -> tuple[Run, Run]:
    """The graph run with Vulkan first (CPU as fallback), and on the CPU alone."""
    return run_graph(build, inputs, [vulkan(), CPUBackend()]), run_graph(build, inputs, [CPUBackend()])


def assert_close(got: np.ndarray, want: np.ndarray, rel: float) -> None:
    """|got - want| <= rel * max|want|, elementwise; NaNs must match."""
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=rel * max(scale, 1e-30))
