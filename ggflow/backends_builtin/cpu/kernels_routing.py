"""The small ops of expert routing: argsort, sigmoid, sum_rows, div, clamp, concat. Vectorized numpy.

They run on a router's [n_expert, n_tokens] logits, a few hundred floats per token, so each is one numpy
call. F16 sources and destinations are widened to float32 and rounded once, as the elementwise kernels do.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, store, to_f32
from ggflow.backends_builtin.cpu.kernels_elementwise import _bind_binary, _bind_unary
from ggflow.core.ops import SORT_DESC
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


def bind_argsort(node: Tensor, arrays: TensorArrays) -> Kernel:
    """Row-wise argsort; ties keep index order (ggml's std::sort leaves their order unspecified)."""
    (a,) = node.src
    a_view, out = arrays.view(a), arrays.view(node)
    descending = node.op_params[0] == SORT_DESC

    def run() -> None:
        keys = to_f32(a_view, a.type)
        out[...] = np.argsort(-keys if descending else keys, axis=-1, kind="stable")
    return run


def bind_sigmoid(node: Tensor, arrays: TensorArrays) -> Kernel:
    def sigmoid(x: np.ndarray, out: np.ndarray) -> None:
        np.negative(x, out=out, dtype=F32)
        np.exp(out, out=out)
        out += np.float32(1.0)
        np.reciprocal(out, out=out)
    return _bind_unary(node, arrays, sigmoid)


def bind_clamp(node: Tensor, arrays: TensorArrays) -> Kernel:
    lo, hi = (np.float32(p) for p in node.op_params)

    def clamp(x: np.ndarray, out: np.ndarray) -> None:
        np.minimum(np.maximum(x, lo, dtype=F32), hi, out=out, dtype=F32)
    return _bind_unary(node, arrays, clamp)


def bind_div(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_binary(node, arrays, np.divide)


def bind_sum_rows(node: Tensor, arrays: TensorArrays) -> Kernel:
    """Each row summed in float64 from left to right and rounded once, as ggml_vec_sum_f32."""
    (a,) = node.src
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)

    def run() -> None:
        x = to_f32(a_view, a.type)
        total = np.zeros(x.shape[:-1], np.float64)
        for c in range(x.shape[-1]):            # a loop over the columns (a router's n_used), not the rows
            total += x[..., c]
        target.array[..., 0] = total.astype(F32)
        target.flush()
    return run


def bind_concat(node: Tensor, arrays: TensorArrays) -> Kernel:
    a, b = node.src
    a_view, b_view, out = arrays.view(a), arrays.view(b), arrays.view(node)
    axis = 3 - node.op_params[0]                 # ggml dim -> numpy axis

    def run() -> None:
        store(out, np.concatenate([to_f32(a_view, a.type), to_f32(b_view, b.type)], axis=axis), node.type)
    return run
