"""``example_numpy``: a backend that runs four elementwise F32 ops with numpy, and nothing else.

It shows the whole backend contract in little code: memory (host buffers tagged with this backend's
name), ``supports_op`` (ops, types and shapes it can run), and ``compute`` (reading a source through
``substitutes`` when the scheduler copied it here from another backend). Everything it declines, the
scheduler runs on the CPU backend; the KV cache stays on the CPU (this backend cannot write it), and the
weights its nodes read (the norm weights a ``mul`` scales by) are copied here once.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import numpy as np

from ggflow.core.backend import Availability, Backend, HostBuffer, substituted_memory
from ggflow.core.ops import PURE_VIEWS, Op
from ggflow.core.tensor import Tensor, strided_view
from ggflow.errors import BackendError

DISABLE_ENV = "GGFLOW_EXAMPLE_NUMPY_DISABLE"


def _add(out: np.ndarray, a: np.ndarray, b: np.ndarray, params: tuple) -> None:
    np.add(a, b, out=out)


def _mul(out: np.ndarray, a: np.ndarray, b: np.ndarray, params: tuple) -> None:
    np.multiply(a, b, out=out)


def _scale(out: np.ndarray, a: np.ndarray, params: tuple) -> None:
    s, bias = params
    np.multiply(a, np.float32(s), out=out)
    if bias:
        np.add(out, np.float32(bias), out=out)


def _silu(out: np.ndarray, a: np.ndarray, params: tuple) -> None:
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0, and x / inf = -0: correct
        denom = np.exp(-a)
    denom += np.float32(1)
    np.divide(a, denom, out=out)


KERNELS: dict[str, Callable[..., None]] = {Op.ADD: _add, Op.MUL: _mul, Op.SCALE: _scale, Op.SILU: _silu}


class ExampleNumpyBackend(Backend):
    name = "example_numpy"
    priority = -10  # below the CPU: installing an example must not change where models run
    description = "numpy add, mul, scale, silu on F32 (an example plugin)"

    @classmethod
    def is_available(cls) -> Availability:
        if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
            return Availability(False, f"disabled by {DISABLE_ENV}")
        return Availability(True, f"numpy {np.__version__}")

    def alloc_buffer(self, size: int) -> HostBuffer:
        return HostBuffer.allocate(size, self.name, self.alignment)

    def supports_op(self, node: Tensor) -> bool:
        if node.op in PURE_VIEWS:  # a view computes nothing (its memory is its source's): nothing to decline
            return True
        if node.op not in KERNELS:
            return False
        if node.type.name != "F32" or any(s.type.name != "F32" for s in node.src):
            return False
        # ggml repeats b over a by any whole multiple; numpy broadcasting only stretches size-1 axes.
        return all(bn in (1, an) for s in node.src[1:] for an, bn in zip(node.ne, s.ne))

    def compute(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None) -> None:
        self.compile(nodes, substitutes)()

    def compile(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None
                ) -> Callable[[], None]:
        # Memory is fixed once the scheduler has allocated the graph, so the numpy views are made
        # once here; each reuse of the graph then only runs the kernels.
        subs = substitutes or {}
        steps = []
        for node in nodes:
            if node.op in PURE_VIEWS:
                continue
            if not self.supports_op(node):
                raise BackendError(f"{self.name} cannot run {node!r}: it runs only "
                                   f"{', '.join(KERNELS)} on F32 tensors")
            sources = [self._array(s, subs) for s in node.src]
            steps.append((KERNELS[node.op], node.numpy(), sources, node.op_params))

        def run() -> None:
            for kernel, out, sources, params in steps:
                kernel(out, *sources, params)
        return run

    def _array(self, t: Tensor, substitutes: Mapping[Tensor, Tensor]) -> np.ndarray:
        """A numpy view of a source: of its copy if the scheduler made one (of it, or of what it views)."""
        memory_of, extra = substituted_memory(t, substitutes, self.name)
        base = memory_of.base()
        if base.buffer is None or not base.buffer.is_host:
            raise BackendError(f"{self.name} reads host memory only, and {t!r} is not in host memory")
        start = base.offset + memory_of.base_offset() + extra
        return strided_view(base.buffer.host_array(), start, t.type, t.ne, t.nb)
