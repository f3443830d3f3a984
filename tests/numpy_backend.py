"""A small numpy backend for scheduler tests: it runs only the ops it is told to support."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ggflow.core.backend import Backend, HostBuffer
from ggflow.core.ops import PURE_VIEWS, Op
from ggflow.core.tensor import Tensor


def _resolve(t: Tensor, subs: Mapping[Tensor, Tensor]) -> np.ndarray:
    return subs.get(t, t).numpy()


_KERNELS = {
    Op.ADD: lambda a, b, p: a + b,
    Op.MUL: lambda a, b, p: a * b,
    Op.SCALE: lambda a, p: a * p[0] + p[1],
    Op.SILU: lambda a, p: a / (1 + np.exp(-a)),
    # ggml mul_mat: out[.., j, i] = dot(a row i, b row j)  ->  b @ a^T per batch
    Op.MUL_MAT: lambda a, b, p: np.matmul(b, np.swapaxes(a, -1, -2)),
    Op.RMS_NORM: lambda a, p: a / np.sqrt(np.mean(a.astype(np.float64) ** 2, -1, keepdims=True) + p[0]),
}


class NumpyTestBackend(Backend):
    name = "numpy_test"
    priority = 10

    def __init__(self, ops: Sequence[str] = tuple(_KERNELS), name: str | None = None):
        self.ops = frozenset(ops)
        if name:
            self.name = name  # type: ignore[misc]
        self.computed: list[str] = []  # names of the nodes this backend ran, in order

    def alloc_buffer(self, size: int) -> HostBuffer:
        return HostBuffer.allocate(size, self.name)

    def supports_op(self, node: Tensor) -> bool:
        return node.op in self.ops or node.op in PURE_VIEWS

    def compute(self, nodes, substitutes=None) -> None:
        subs = substitutes or {}
        for node in nodes:
            self.computed.append(node.name)
            if node.view_src is not None:
                continue
            srcs = [_resolve(s, subs).astype(np.float32) for s in node.src]
            node.numpy()[...] = _KERNELS[node.op](*srcs, node.op_params)
