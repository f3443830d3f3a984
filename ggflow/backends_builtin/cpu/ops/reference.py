"""Plugin ops (ggflow.core.ops.register_op) on the CPU: their reference implementation, bound like a kernel.

The reference gets float32 numpy arrays of the sources (integer sources as stored) and returns the result's
float32 values; converting into the destination's type follows the other kernels (arrays.store).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.backends_builtin.cpu.arrays import F32, TensorArrays, store, to_f32
from ggflow.core.ops import PluginOp
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError

Kernel = Callable[[], None]


def bind_reference(node: Tensor, arrays: TensorArrays, spec: PluginOp) -> Kernel:
    src_views = [(arrays.view(s), s.type) for s in node.src]
    d_view, shape = arrays.view(node), tuple(node.ne[::-1])

    def run() -> None:
        inputs = [view if traits.name.startswith("I") else to_f32(view, traits) for view, traits in src_views]
        out = np.asarray(spec.reference(inputs, node.op_params), dtype=F32)
        if out.size != node.nelements:
            raise BackendError(f"the reference of plugin op {spec.name!r} returned {out.shape} for "
                               f"{node!r}, which needs {shape}")
        store(d_view, out.reshape(shape), node.type)
    return run
