"""The small ops of expert routing (argsort, sigmoid, sum_rows, div, clamp, concat, add_id) and soft_max with
attention sinks. Vectorized numpy.

They run on a router's [n_expert, n_tokens] logits, a few hundred floats per token, so each is one numpy
call. F16 sources and destinations are widened to float32 and rounded once, as the elementwise kernels do.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, store, to_f32
from ggflow.backends_builtin.cpu.ops.elementwise import _bind_binary, _bind_unary
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
    """Each row summed in float64 and rounded once to float32, as ggml_vec_sum_f32 (its sum runs left to
    right, numpy's pairwise: the float64 sums differ far below a float32 rounding step)."""
    (a,) = node.src
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)

    def run() -> None:
        target.array[..., 0] = to_f32(a_view, a.type).sum(axis=-1, dtype=np.float64).astype(F32)
        target.flush()
    return run


def bind_concat(node: Tensor, arrays: TensorArrays) -> Kernel:
    a, b = node.src
    a_view, b_view, out = arrays.view(a), arrays.view(b), arrays.view(node)
    axis = 3 - node.op_params[0]                 # ggml dim -> numpy axis

    def run() -> None:
        store(out, np.concatenate([to_f32(a_view, a.type), to_f32(b_view, b.type)], axis=axis), node.type)
    return run


def bind_add_id(node: Tensor, arrays: TensorArrays) -> Kernel:
    """out[t, e] = a[t, e] + b[ids[t, e]] (numpy order): each chosen expert's bias."""
    a, b, ids = node.src
    a_view, b_view, ids_view, out = arrays.view(a)[0], arrays.view(b)[0, 0], arrays.view(ids)[0, 0], arrays.view(node)[0]

    def run() -> None:
        bias = to_f32(b_view, b.type)                               # (n_expert, n)
        np.add(to_f32(a_view, a.type), bias[ids_view], out=out)
    return run


def bind_soft_max_sinks(node: Tensor, arrays: TensorArrays) -> Kernel:
    """ggml's soft_max with sinks: w = x*scale + mask; m = max(max(w), sink); y = exp(w - m) / (sum + exp(sink
    - m)), the sum in float64 (one value of y per row rounded once, as ops.softmax.soft_max_rows)."""
    a, *rest = node.src
    mask, sinks = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
    scale = np.float32(node.op_params[0])
    a_view, out = arrays.view(a), arrays.view(node)
    mask_rows = arrays.view(mask)[:, :, : a.ne[1], :] if mask is not None else None
    sink_view = arrays.view(sinks).reshape(-1)

    def run() -> None:
        w = to_f32(a_view, a.type) * scale                          # (n3, n_head, rows, n)
        if mask_rows is not None:
            m = to_f32(mask_rows, mask.type)
            w = w + np.tile(m, (w.shape[0] // m.shape[0], w.shape[1] // m.shape[1], 1, 1))
        sink = sink_view.astype(np.float32)[None, :, None, None]
        top = np.maximum(w.max(axis=-1, keepdims=True), sink)
        e = np.exp(w - top)
        total = e.sum(axis=-1, dtype=np.float64, keepdims=True) + np.exp(sink - top).astype(np.float64)
        out[...] = e * (1.0 / total).astype(F32)
    return run
