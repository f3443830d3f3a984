"""rms_norm and norm over each row (ne[0]), in numba, with ggml's precision choices.

ggml sums in double (ggml_float) but squares and scales in float:
  rms_norm: sum += (double)(x*x); mean = (float)(sum/n); scale = 1.0f/sqrtf(mean + eps); y = x*scale
  norm:     mean = (float)sum(double x) / n; var = (float)(sum((double)(float)(x-mean)^2) / n);
            y = (x - mean) * (1.0f/sqrtf(var + eps))
rms_norm is bit-exact with ggml. ggml's norm sums the squared deviations in SIMD groups (8 or 16 floats
added in float, then into the double), we add them one by one into the double: the variance can differ
in its last float bit.

The kernels take 4-D float32 arrays of any strides (numba layout "A"), so one compiled signature serves
contiguous tensors, views and F32 copies of F16 tensors alike.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ggflow.backends_builtin.cpu.arrays import F32Target, TensorArrays, to_f32
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]
ROWS_SIGNATURE = "void(float32[:, :, :, :], float32[:, :, :, :], float32)"


@njit(ROWS_SIGNATURE, cache=True, parallel=True, fastmath=False, error_model="numpy")
def rms_norm_rows(x, y, eps):  # x, y: (n3, n2, n1, n0)
    n3, n2, n1, n0 = x.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        total = 0.0
        for i0 in range(n0):
            v = x[i3, i2, i1, i0]
            total += np.float64(v * v)
        mean = np.float32(total / n0)
        scale = np.float32(1.0) / np.sqrt(mean + eps)
        for i0 in range(n0):
            y[i3, i2, i1, i0] = x[i3, i2, i1, i0] * scale


@njit(ROWS_SIGNATURE, cache=True, parallel=True, fastmath=False, error_model="numpy")
def norm_rows(x, y, eps):  # x, y: (n3, n2, n1, n0)
    n3, n2, n1, n0 = x.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        total = 0.0
        for i0 in range(n0):
            total += np.float64(x[i3, i2, i1, i0])
        mean = np.float32(total) / np.float32(n0)
        squares = 0.0
        for i0 in range(n0):
            d = x[i3, i2, i1, i0] - mean
            squares += np.float64(d * d)
        variance = np.float32(squares / n0)
        scale = np.float32(1.0) / np.sqrt(variance + eps)
        for i0 in range(n0):
            y[i3, i2, i1, i0] = (x[i3, i2, i1, i0] - mean) * scale


def bind_rms_norm(node: Tensor, arrays: TensorArrays) -> Kernel:
    return bind_rows(rms_norm_rows, node, arrays, np.float32(node.op_params[0]))


def bind_norm(node: Tensor, arrays: TensorArrays) -> Kernel:
    return bind_rows(norm_rows, node, arrays, np.float32(node.op_params[0]))


def bind_rows(kernel, node: Tensor, arrays: TensorArrays, *params) -> Kernel:
    """Bind kernel(x_f32, y_f32, *params) for a node of one source; F16 goes through float32 copies."""
    (a,) = node.src
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)
    y = target.array
    if a.type.name == "F32" and target.is_direct:
        return lambda: kernel(a_view, y, *params)

    def run_converted() -> None:
        kernel(to_f32(a_view, a.type), y, *params)
        target.flush()
    return run_converted
