"""soft_max(a * scale + mask) over each row, as ggml_compute_forward_soft_max_f32 computes it.

Each row: w = x*scale (float) + mask row (float; an F16 mask is widened exactly); max; e = expf(w - max),
summed in double; y = e * (float)(1.0/sum). The mask row for row i1 is mask row i1 (a mask may have more
rows, padding, which are not read) and the mask repeats over dims 2 and 3 (index modulo its size).

The exp is numpy's: its SIMD expf is several times faster than the scalar expf a numba loop calls, and its
bits are the ones the models were checked in (gemma3's check against llama.cpp has little margin: ggml's
own vector expf in its place, about an ulp away on half the elements, moved a teacher-forced logit from
0.79 to 1.06 against a tolerance of 0.83). The rest is one numba pass before (scale, mask, row max) and one
after (sum, 1/sum, scale). The sum is in float64 in a fixed order that depends on each element's index
only: element c goes to lane c % LANES, the lanes are added in a fixed tree at the end. So a run of
elements that are exactly 0 (masked cells) changes nothing wherever it lies, and the fused attention
(ops/attention.py), which skips whole pages of them, gives these bits. ggml sums each vector of exps
in float before adding it to its double: another order, about an ulp away.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, split_repeats, to_f32
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]
LANES = 8   # float64 partial sums per row: element c in lane c % LANES


def soft_max_rows(x: np.ndarray, mask: np.ndarray | None, scale: np.float32, y: np.ndarray) -> None:
    """x, y: (n3, n2, n1, n0) float32, y written; mask: (m3, m2, n1, n0) with m3 | n3 and m2 | n2.
    numpy's expressions, pairwise sum: the reference the kernels are tested against."""
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


@njit(cache=True, fastmath=False, inline="always")
def row_max(seg, top):
    """max(top, the elements of seg), NaN if any of them is NaN (as numpy's max)."""
    for c in range(seg.shape[0]):
        v = seg[c]
        if v != v:
            return v
        if v > top:
            top = v
    return top


@njit(cache=True, fastmath=False, inline="always")
def add_to_lanes(seg, lanes):
    """lanes[c % LANES] += seg[c] in float64; seg is a run of a row that starts at a multiple of LANES.
    (Indexed from 0 by the loop variable: LLVM drops numba's negative-index wraparound.)"""
    n = seg.shape[0]
    s0, s1, s2, s3, s4, s5, s6, s7 = lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]
    c = 0
    while c + LANES <= n:
        s0 += np.float64(seg[c])
        s1 += np.float64(seg[c + 1])
        s2 += np.float64(seg[c + 2])
        s3 += np.float64(seg[c + 3])
        s4 += np.float64(seg[c + 4])
        s5 += np.float64(seg[c + 5])
        s6 += np.float64(seg[c + 6])
        s7 += np.float64(seg[c + 7])
        c += LANES
    lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7] = s0, s1, s2, s3, s4, s5, s6, s7
    while c < n:
        lanes[c % LANES] += np.float64(seg[c])
        c += 1


@njit(cache=True, fastmath=False, inline="always")
def inverse_of_sum(lanes):
    """float32(1.0 / the lanes' sum), the lanes added in a fixed tree."""
    total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    return np.float32(1.0 / total)


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
                top = row_max(row, np.float32(-np.inf))
                for i0 in range(n0):
                    row[i0] = row[i0] - top


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def normalize(y):
    """y *= float32(1.0 / its row's sum), the sum in LANES float64 lanes."""
    n3, n2, n1, n0 = y.shape
    lanes = np.empty(LANES, np.float64)
    for i3 in range(n3):
        for i2 in range(n2):
            for i1 in range(n1):
                row = y[i3, i2, i1]
                lanes[:] = 0.0
                add_to_lanes(row, lanes)
                inverse = inverse_of_sum(lanes)
                for i0 in range(n0):
                    row[i0] = row[i0] * inverse


def soft_max_kernel(x: np.ndarray, mask: np.ndarray, has_mask: bool, scale: np.float32, y: np.ndarray) -> None:
    """y = soft_max(x * scale + mask) per row: numba, numpy's exp, numba."""
    scaled_masked_minus_max(x, mask, has_mask, scale, y)
    np.exp(y, out=y)
    normalize(y)


def bind_soft_max(node: Tensor, arrays: TensorArrays) -> Kernel:
    a = node.src[0]
    scale = np.float32(node.op_params[0])
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)
    y = target.array
    masked = len(node.src) > 1
    mask = node.src[1] if masked else None
    mask_rows = arrays.view(mask)[:, :, : a.ne[1], :] if masked else np.zeros((1, 1, 1, 1), F32)  # padding rows past ne1 are never read
    mask_f32 = mask is None or mask.type.name == "F32"

    def run() -> None:
        x = to_f32(a_view, a.type)
        m = mask_rows if mask_f32 else to_f32(mask_rows, mask.type)
        soft_max_kernel(x, m, masked, scale, y)
        target.flush()
    return run
