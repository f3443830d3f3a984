"""Chains of nodes the CPU plan runs as one kernel call: fewer Python calls per decode step.

A decode step of a small model is mostly Python: each kernel call costs about a microsecond whatever its
size. Where ggml's graph has a chain that one pass can do (a residual add, the next rms_norm and its
weight), the plan calls one numba kernel for the chain instead of one kernel per node. A fused kernel
does each node's float32 operations in the node's order and still writes every node's result (another
node, or another split, may read it), so its results are the unfused results bit for bit. It interleaves
the nodes row by row, so it declines when an output shares memory with another array of the chain other
than as an exact alias (``_overlap``).

Chains (``steps`` are the plan's computing nodes, views left out):
  add(a, b) -> rms_norm -> mul(., w)     all F32, contiguous, a and b of one shape, w one row, fewer
  rms_norm -> mul(., w)                  than threads.PARALLEL_MIN_ELEMENTS (a decode step's)
  silu(g) -> mul(u, .) or mul(., u)      all F32, contiguous, one shape (a gated FFN; numpy's exp stays)
  mul_mat(K, q) -> soft_max(., mask) -> mul_mat(V, .) [-> cont(permute(., 0, 2, 1, 3))]
                                         attention over the KV cache (ops/attention.py): the one chain
                                         that writes only its last node, taken where nothing else reads
                                         the others (attention_pages.attention_chains)
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ggflow.backends_builtin.cpu import entry_points
from ggflow.backends_builtin.cpu.ops import attention as kernels_attention
from ggflow.backends_builtin.cpu.ops import elementwise as kernels_elementwise
from ggflow.backends_builtin.cpu.ops import norm as kernels_norm
from ggflow.backends_builtin.cpu.arrays import TensorArrays
from ggflow.backends_builtin.cpu.threads import PARALLEL_MIN_ELEMENTS
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


def bind_fused(steps: Sequence[Tensor], i: int, arrays: TensorArrays,
               attention: Mapping[Tensor, tuple[Tensor, ...]] | None = None,
               n_threads: int | None = None) -> tuple[Kernel, int] | None:
    """A kernel for the chain that starts at steps[i] and how many steps it runs; None: no chain starts here.
    attention: attention_pages.attention_chains of the plan's nodes; n_threads: the plan's (None: numba's)."""
    chain = attention.get(steps[i]) if attention else None
    tries = () if chain is None else (chain, chain[:2]) if len(chain) == 3 else (chain,)   # the cont too, else not
    for rest in tries:
        if tuple(steps[i + 1:i + 1 + len(rest)]) == rest:
            kernel = kernels_attention.bind_attention(arrays, steps[i], *rest, n_threads=n_threads)
            if kernel is not None:
                return kernel, 1 + len(rest)
    for chain in (_add_rms_norm_mul, _rms_norm_mul, _silu_mul):
        found = chain(steps, i, arrays)
        if found is not None:
            return found
    return None


def _add_rms_norm_mul(steps: Sequence[Tensor], i: int, arrays: TensorArrays) -> tuple[Kernel, int] | None:
    if i + 2 >= len(steps) or steps[i].op != Op.ADD:
        return None
    add, norm, mul = steps[i:i + 3]
    if norm.op != Op.RMS_NORM or norm.src[0] is not add or not _is_weight_mul(mul, norm):
        return None
    a, b = add.src
    if a.ne != add.ne or b.ne != add.ne:
        return None
    rows = _rows(arrays, a, b, add, norm, mul)
    w = _row(arrays, mul.src[1])
    if rows is None or w is None or _overlap([*rows, w], writes=(2, 3, 4), read_by_every_row=4):
        return None
    a_rows, b_rows, s_rows, y_rows, z_rows = rows
    eps = np.float32(norm.op_params[0])
    return entry_points.bind(kernels_norm.add_rms_norm_mul_rows, a_rows, b_rows, s_rows, y_rows, w, z_rows, eps), 3


def _rms_norm_mul(steps: Sequence[Tensor], i: int, arrays: TensorArrays) -> tuple[Kernel, int] | None:
    if i + 1 >= len(steps) or steps[i].op != Op.RMS_NORM:
        return None
    norm, mul = steps[i:i + 2]
    if not _is_weight_mul(mul, norm):
        return None
    rows = _rows(arrays, norm.src[0], norm, mul)
    w = _row(arrays, mul.src[1])
    if rows is None or w is None or _overlap([*rows, w], writes=(1, 2), read_by_every_row=3):
        return None
    x_rows, y_rows, z_rows = rows
    eps = np.float32(norm.op_params[0])
    return entry_points.bind(kernels_norm.rms_norm_mul_rows, x_rows, y_rows, w, z_rows, eps), 2


def _silu_mul(steps: Sequence[Tensor], i: int, arrays: TensorArrays) -> tuple[Kernel, int] | None:
    if i + 1 >= len(steps) or steps[i].op != Op.SILU:
        return None
    silu, mul = steps[i:i + 2]
    if mul.op != Op.MUL or silu not in mul.src or mul.src[0] is mul.src[1]:
        return None
    other = mul.src[1] if mul.src[0] is silu else mul.src[0]
    rows = _rows(arrays, silu.src[0], other, silu, mul)
    if rows is None or _overlap(rows, writes=(2, 3)):
        return None
    x, u, s, z = (r.reshape(-1) for r in rows)
    t = arrays.scratch("silu exp", x.shape, x.dtype)   # exp(-x)
    kernel = entry_points.bind(kernels_elementwise.silu_from_exp_mul, x, t, s, u, z)

    def run() -> None:
        np.negative(x, out=t)
        np.exp(t, out=t)
        kernel()
    return run, 2


def _is_weight_mul(mul: Tensor, norm: Tensor) -> bool:
    """mul(norm, w) with w a single row as long as norm's rows (ggml's repeat over every other dim), on a
    norm small enough to run serially (a prompt's keeps rms_norm's parallel driver: threads.py)."""
    if mul.op != Op.MUL or mul.src[0] is not norm or norm.nelements >= PARALLEL_MIN_ELEMENTS:
        return False
    w = mul.src[1]
    return w.ne[0] == norm.ne[0] and w.ne[1:] == (1, 1, 1) and mul.ne == norm.ne


def _rows(arrays: TensorArrays, *tensors: Tensor) -> list[np.ndarray] | None:
    """(rows, ne0) float32 views of F32 tensors of one shape, None unless every one is contiguous."""
    views = []
    for t in tensors:
        if t.type.name != "F32" or t.ne != tensors[-1].ne:
            return None
        view = arrays.view(t)
        if not view.flags.c_contiguous:
            return None
        views.append(view.reshape(-1, t.ne[0]))
    return views


def _row(arrays: TensorArrays, t: Tensor) -> np.ndarray | None:
    if t.type.name != "F32":
        return None
    view = arrays.view(t).reshape(-1)
    return view if view.flags.c_contiguous else None


def _overlap(views: list[np.ndarray], writes: tuple[int, ...], read_by_every_row: int | None = None) -> bool:
    """Whether an array the chain writes (indices ``writes``) shares memory with another of its arrays in a
    way row-by-row order would break. The same memory in the same layout does not: the allocator gave a
    later node the memory of an input that dies at the earlier one, and each row of that input is read
    before the same row of the output is written (an elementwise op in place). An array every row reads
    (a norm's weight row) may share nothing."""
    for w in writes:
        for j, other in enumerate(views):
            if j != w and np.may_share_memory(views[w], other) and (
                    j == read_by_every_row or not _same_layout(views[w], other)):
                return True
    return False


def _same_layout(x: np.ndarray, y: np.ndarray) -> bool:
    return (x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
            and x.shape == y.shape and x.strides == y.strides)
