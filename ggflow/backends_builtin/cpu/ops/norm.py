"""rms_norm and norm over each row (ne[0]), in numba, with ggml's precision choices.

ggml sums in double (ggml_float) but squares and scales in float:
  rms_norm: sum += (double)(x*x); mean = (float)(sum/n); scale = 1.0f/sqrtf(mean + eps); y = x*scale
  norm:     mean = (float)sum(double x) / n; var = (float)(sum((double)(float)(x-mean)^2) / n);
            y = (x - mean) * (1.0f/sqrtf(var + eps))
rms_norm is bit-exact with ggml. ggml's norm sums the squared deviations in SIMD groups (8 or 16 floats
added in float, then into the double), we add them one by one into the double: the variance can differ
in its last float bit.

The kernels take 4-D float32 arrays of any strides; numba compiles one version per layout it meets
(contiguous, strided), and the binders pass float32 scalars, so each kernel has few signatures.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ggflow.backends_builtin.cpu.arrays import F32Target, TensorArrays, to_f32
from ggflow.backends_builtin.cpu.threads import driver_for
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


RMS_NORM, NORM = 0, 1


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rms_norm_row(x, y, eps):
    total = 0.0
    for i in range(x.shape[0]):
        total += np.float64(x[i] * x[i])
    mean = np.float32(total / x.shape[0])
    scale = np.float32(1.0) / np.sqrt(mean + eps)
    for i in range(x.shape[0]):
        y[i] = x[i] * scale


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def norm_row(x, y, eps):
    n = x.shape[0]
    total = 0.0
    for i in range(n):
        total += np.float64(x[i])
    mean = np.float32(total) / np.float32(n)
    squares = 0.0
    for i in range(n):
        d = x[i] - mean
        squares += np.float64(d * d)
    variance = np.float32(squares / n)
    scale = np.float32(1.0) / np.sqrt(variance + eps)
    for i in range(n):
        y[i] = (x[i] - mean) * scale


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def normalize_row(kind, x, y, eps):
    if kind == RMS_NORM:
        rms_norm_row(x, y, eps)
    else:
        norm_row(x, y, eps)


@njit(cache=True, nogil=True, parallel=True, fastmath=False, error_model="numpy")
def normalize_rows_parallel(kind, x, y, eps):  # x, y: (n3, n2, n1, n0)
    n3, n2, n1, _ = x.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        normalize_row(kind, x[i3, i2, i1], y[i3, i2, i1], eps)


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def normalize_rows_serial(kind, x, y, eps):
    n3, n2, n1, _ = x.shape
    for i3 in range(n3):
        for i2 in range(n2):
            for i1 in range(n1):
                normalize_row(kind, x[i3, i2, i1], y[i3, i2, i1], eps)


def bind_rms_norm(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_normalize(RMS_NORM, node, arrays)


def bind_norm(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_normalize(NORM, node, arrays)


def _bind_normalize(kind: int, node: Tensor, arrays: TensorArrays) -> Kernel:
    """F32 runs on the views themselves; F16 (or any other type) through float32 copies."""
    (a,) = node.src
    a_view = arrays.view(a)
    target = F32Target(arrays.view(node), node)
    y, eps = target.array, np.float32(node.op_params[0])
    kernel = driver_for(node.nelements, normalize_rows_parallel, normalize_rows_serial)
    if a.type.name == "F32" and target.is_direct:
        return lambda: kernel(kind, a_view, y, eps)

    def run_converted() -> None:
        kernel(kind, to_f32(a_view, a.type), y, eps)
        target.flush()
    return run_converted


# -- fused chains (fusion.py): the same row functions, one call for the chain ---------------------------
@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rms_norm_mul_rows(x, y, w, z, eps):
    """y = rms_norm(x), z = y * w (w one row, broadcast): the rms_norm and mul kernels, row by row."""
    for r in range(x.shape[0]):
        rms_norm_row(x[r], y[r], eps)
        for i in range(x.shape[1]):
            z[r, i] = y[r, i] * w[i]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def add_rms_norm_mul_rows(a, b, s, y, w, z, eps):
    """s = a + b, then rms_norm_mul_rows(s, y, w, z): a residual add and the next norm in one call."""
    for r in range(a.shape[0]):
        for i in range(a.shape[1]):
            s[r, i] = a[r, i] + b[r, i]
        rms_norm_row(s[r], y[r], eps)
        for i in range(a.shape[1]):
            z[r, i] = y[r, i] * w[i]
