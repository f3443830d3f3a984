"""soft_max(a * scale + mask) over each row, as ggml_compute_forward_soft_max_f32 computes it. numpy.

Each row: w = x*scale (float) + mask row (float; an F16 mask is widened exactly); max; e = expf(w - max),
summed in double; y = e * (float)(1.0/sum). The mask row for row i1 is mask row i1 (a mask may have more
rows, padding, which are not read) and the mask repeats over dims 2 and 3 (index modulo its size).

The exp and the double sum are numpy's: its SIMD expf is several times faster than the scalar expf a
numba loop calls, and its pairwise sum is the order the results were checked in. The rest (scale, mask,
max, the final scale) is one numba pass before and one after, which compute the same float32 operations
as the numpy expressions in ``soft_max_rows`` (the reference they are tested against) in a third of the
Python calls. ggml evaluates expf with its own SIMD polynomial (ggml_v_expf) and sums each vector of
exps in float before adding it to the double; both differ from ours by about an ulp.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, split_repeats, to_f32
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


def soft_max_rows(x: np.ndarray, mask: np.ndarray | None, scale: np.float32, y: np.ndarray) -> None:
    """x, y: (n3, n2, n1, n0) float32, y written; mask: (m3, m2, n1, n0) with m3 | n3 and m2 | n2."""
    np.multiply(x, scale, out=y)
    if mask is not None:
        reps = (y.shape[0] // mask.shape[0], y.shape[1] // mask.shape[1], 1, 1)
        tiles = split_repeats(y, reps)                   # mask index = y index modulo the mask's size
        np.add(tiles, split_repeats(mask, (1, 1, 1, 1)), out=tiles)
    y -= y.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):                  # a row masked everywhere: NaN, as in ggml
        np.exp(y, out=y)
    inverse = (1.0 / y.sum(axis=-1, dtype=np.float64, keepdims=True)).astype(F32)
    y *= inverse


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def scaled_masked_minus_max(x, mask, has_mask, scale, y):
    """y = x*scale (+ mask) minus its row's max: soft_max_rows up to the exp. mask repeats over dims 3, 2."""
    n3, n2, n1, n0 = y.shape
    for i3 in range(n3):
        for i2 in range(n2):
            for i1 in range(n1):
                row, xrow = y[i3, i2, i1], x[i3, i2, i1]
                if has_mask:
                    mrow = mask[i3 % mask.shape[0], i2 % mask.shape[1], i1]
                    for i0 in range(n0):
                        row[i0] = xrow[i0] * scale + mrow[i0]
                else:
                    for i0 in range(n0):
                        row[i0] = xrow[i0] * scale
                top = row.max()   # numpy's max: NaN if any is NaN
                for i0 in range(n0):
                    row[i0] = row[i0] - top


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def scale_by_inverse(y, sums):
    """y *= float32(1.0 / sum) per row, sums (n3, n2, n1, 1) float64."""
    n3, n2, n1, n0 = y.shape
    for i3 in range(n3):
        for i2 in range(n2):
            for i1 in range(n1):
                inverse = np.float32(1.0 / sums[i3, i2, i1, 0])
                for i0 in range(n0):
                    y[i3, i2, i1, i0] = y[i3, i2, i1, i0] * inverse


def bind_soft_max(node: Tensor, arrays: TensorArrays) -> Kernel:
    a = node.src[0]
    scale = np.float32(node.op_params[0])
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)
    y = target.array
    sums = np.empty((*y.shape[:3], 1), np.float64)
    masked = len(node.src) > 1
    mask = node.src[1] if masked else None
    mask_rows = arrays.view(mask)[:, :, : a.ne[1], :] if masked else np.zeros((1, 1, 1, 1), F32)  # padding rows past ne1 are never read
    mask_f32 = mask is None or mask.type.name == "F32"

    def run() -> None:
        x = to_f32(a_view, a.type)
        m = mask_rows if mask_f32 else to_f32(mask_rows, mask.type)
        scaled_masked_minus_max(x, m, masked, scale, y)
        np.exp(y, out=y)
        np.add.reduce(y, axis=-1, dtype=np.float64, keepdims=True, out=sums)
        scale_by_inverse(y, sums)
        target.flush()
    return run
