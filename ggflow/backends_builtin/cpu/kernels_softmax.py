"""soft_max(a * scale + mask) over each row, in numba, as ggml_compute_forward_soft_max_f32 computes it.

Each row: w = x*scale (float) + mask row (float; an F16 mask is widened exactly); max; e = expf(w - max)
summed in double; y = e * (float)(1.0/sum). The mask row for row i1 is mask row i1 (the mask may have more
rows, padding, which are not read) and the mask broadcasts over dims 2 and 3 by index modulo its size.
ggml evaluates expf with a SIMD polynomial (ggml_v_expf) in its vector loop, we use libm's expf: the two
differ by about one ulp.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, to_f32
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


@njit("void(float32[:, :, :, :], float32[:, :, :, :], boolean, float32, float32[:, :, :, :])",
      cache=True, parallel=True, fastmath=False, error_model="numpy")
def soft_max_rows(x, mask, has_mask, scale, y):  # x, y: (n3, n2, n1, n0); mask: (m3, m2, >= n1, n0)
    n3, n2, n1, n0 = x.shape
    m3, m2 = mask.shape[0], mask.shape[1]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        row_max = np.float32(-np.inf)
        for i0 in range(n0):
            w = x[i3, i2, i1, i0] * scale
            if has_mask:
                w += mask[i3 % m3, i2 % m2, i1, i0]
            y[i3, i2, i1, i0] = w
            row_max = max(row_max, w)
        total = 0.0
        for i0 in range(n0):
            e = np.exp(y[i3, i2, i1, i0] - np.float32(row_max))
            y[i3, i2, i1, i0] = e
            total += np.float64(e)
        inv = np.float32(1.0 / total)
        for i0 in range(n0):
            y[i3, i2, i1, i0] *= inv


def bind_soft_max(node: Tensor, arrays: TensorArrays) -> Kernel:
    a = node.src[0]
    (scale,) = (np.float32(p) for p in node.op_params[:1])
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)
    y = target.array
    if len(node.src) > 1:
        mask = node.src[1]
        mask_rows = arrays.view(mask)[:, :, : a.ne[1], :]   # padding rows past ne1 are never read
        mask_type, has_mask = mask.type, True
    else:
        mask_rows, mask_type, has_mask = np.zeros((1, 1, 1, 1), dtype=F32), None, False

    def run() -> None:
        m = to_f32(mask_rows, mask_type) if has_mask else mask_rows
        soft_max_rows(to_f32(a_view, a.type), m, has_mask, scale, y)
        target.flush()
    return run
