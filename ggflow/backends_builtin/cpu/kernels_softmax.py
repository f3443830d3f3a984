"""soft_max(a * scale + mask) over each row, as ggml_compute_forward_soft_max_f32 computes it. numpy.

Each row: w = x*scale (float) + mask row (float; an F16 mask is widened exactly); max; e = expf(w - max),
summed in double; y = e * (float)(1.0/sum). The mask row for row i1 is mask row i1 (a mask may have more
rows, padding, which are not read) and the mask repeats over dims 2 and 3 (index modulo its size).

Vectorized numpy rather than a numba loop: numpy's SIMD expf is several times faster than the scalar
expf a numba loop calls. ggml evaluates expf with its own SIMD polynomial (ggml_v_expf) and sums each
vector of exps in float before adding it to the double; both differ from ours by about an ulp.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

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


def bind_soft_max(node: Tensor, arrays: TensorArrays) -> Kernel:
    a = node.src[0]
    scale = np.float32(node.op_params[0])
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)
    y = target.array
    if len(node.src) == 1:
        def run() -> None:
            soft_max_rows(to_f32(a_view, a.type), None, scale, y)
            target.flush()
        return run

    mask = node.src[1]
    mask_rows = arrays.view(mask)[:, :, : a.ne[1], :]   # padding rows past ne1 are never read

    def run_masked() -> None:
        soft_max_rows(to_f32(a_view, a.type), to_f32(mask_rows, mask.type), scale, y)
        target.flush()
    return run_masked
