"""Activation quantizers for the quantized matmul kernels: Q8_0, Q8_1 and Q8_K, as ggml's
``quantize_row_q8_0_ref`` / ``quantize_row_q8_1_ref`` / ``quantize_row_q8_K_ref`` compute them.

The kernels want the quantized activations split, not in ggml's block bytes: the int8 values
widened to int16 (the kernels multiply in 16-bit lanes), one float32 scale per block and the
per-block (or per-16) sums some weight types need. ``*_to_ggml_bytes`` reassemble ggml's
block layout from the split form, which is how the tests compare against ggml byte for byte.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.products.qmm.floats import round_f32_to_f16

F32 = np.float32
I16 = np.int16
I32 = np.int32

QK8_0 = 32
QK_K = 256


@njit(cache=True, nogil=True, fastmath=False, inline="always")
def f16_round(v):
    """Round a float32 to the nearest float16 (ties to even, inf past the range, as ggml's fp32 -> fp16),
    as float32: one vcvtps2ph where the CPU has F16C (``qmm.floats.round_f32_to_f16``). The frexp/ldexp
    arithmetic this replaced cost libm calls per block: Q8_1 of 4 x 576 values took 3.9 us, now 2.1."""
    return round_f32_to_f16(F32(v))


@njit(cache=True, fastmath=False, inline="always")
def _round_half_away(v):
    """C roundf of a float32: ties away from zero. In float32, where a block's 32 values take 16-wide vectors
    (float64 took 8): |v| - trunc(|v|) is exact, so comparing it with 0.5 rounds as roundf does (|v| + 0.5
    would not: 0.49999997 + 0.5 rounds up to 1.0 in float32)."""
    a = abs(v)
    t = np.trunc(a)
    r = t + F32(1.0) if a - t >= F32(0.5) else t
    return -r if v < 0 else r


@njit(cache=True, nogil=True, fastmath=False)
def quantize_q8_0(x, xq, d, xsum):
    """x (n, k) f32 -> xq (n, k) i16, d (n, k//32) f32 (f16-rounded), xsum (n, k//32) i32."""
    n, k = x.shape
    nb = k // QK8_0
    for i in range(n):
        for b in range(nb):
            o = b * QK8_0
            amax = F32(0.0)
            for j in range(QK8_0):
                amax = max(amax, abs(x[i, o + j]))
            db = F32(amax / F32(127.0))
            idb = F32(F32(1.0) / db) if db != 0 else F32(0.0)
            s = 0
            for j in range(QK8_0):
                q = I16(_round_half_away(F32(x[i, o + j] * idb)))
                xq[i, o + j] = q
                s += q
            d[i, b] = f16_round(db)
            xsum[i, b] = s


@njit(cache=True, nogil=True, fastmath=False)
def quantize_q8_1(x, xq, d, xs):
    """Q8_0 plus xs = f16(d * sum(q)) per block, the term Q4_1/Q5_1 mins multiply.

    ``d`` is the f16-rounded scale, but ``xs`` uses the unrounded one, exactly as ggml does.
    """
    n, k = x.shape
    nb = k // QK8_0
    for i in range(n):
        for b in range(nb):
            o = b * QK8_0
            amax = F32(0.0)
            for j in range(QK8_0):
                amax = max(amax, abs(x[i, o + j]))
            db = F32(amax / F32(127.0))
            idb = F32(F32(1.0) / db) if db != 0 else F32(0.0)
            s = 0
            for j in range(QK8_0):
                q = I16(_round_half_away(F32(x[i, o + j] * idb)))
                xq[i, o + j] = q
                s += q
            d[i, b] = f16_round(db)
            xs[i, b] = f16_round(F32(F32(s) * db))


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")   # C's 1 / -0.0 = -inf for an infinite row, not a raise
def quantize_q8_K(x, xq, d, bsums):
    """x (n, k) f32 -> xq (n, k) i16, d (n, k//256) f32, bsums (n, k//16) i32 (sums of 16)."""
    n, k = x.shape
    nb = k // QK_K
    for i in range(n):
        for b in range(nb):
            o = b * QK_K
            amax = F32(0.0)
            vmax = F32(0.0)
            for j in range(QK_K):
                ax = abs(x[i, o + j])
                if ax > amax:
                    amax = ax
                    vmax = x[i, o + j]
            if amax == 0:
                d[i, b] = 0.0
                for j in range(QK_K):
                    xq[i, o + j] = 0
                for g in range(QK_K // 16):
                    bsums[i, b * 16 + g] = 0
                continue
            iscale = F32(F32(-127.0) / vmax)
            for j in range(QK_K):
                # ggml's nearest_int: float32 add of 1.5 * 2**23, i.e. round half to even
                q = I32(np.rint(F32(iscale * x[i, o + j])))
                xq[i, o + j] = min(127, q)
            for g in range(QK_K // 16):
                s = 0
                for j in range(16):
                    s += xq[i, o + g * 16 + j]
                bsums[i, b * 16 + g] = s
            d[i, b] = F32(F32(1.0) / iscale)


def q8_0_to_ggml_bytes(xq: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Split Q8_0 (xq (n, k) i16, d (n, nb)) -> ggml block_q8_0 rows (n, nb * 34) uint8."""
    n, k = xq.shape
    nb = k // QK8_0
    out = np.empty((n, nb, 34), np.uint8)
    out[:, :, :2] = d.astype(np.float16).reshape(n, nb, 1).view(np.uint8)
    out[:, :, 2:] = xq.astype(np.int8).reshape(n, nb, QK8_0).view(np.uint8)
    return out.reshape(n, nb * 34)


def q8_1_to_ggml_bytes(xq: np.ndarray, d: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Split Q8_1 -> ggml block_q8_1 rows (n, nb * 36) uint8: d, s (f16 each), 32 int8."""
    n, k = xq.shape
    nb = k // QK8_0
    out = np.empty((n, nb, 36), np.uint8)
    out[:, :, 0:2] = d.astype(np.float16).reshape(n, nb, 1).view(np.uint8)
    out[:, :, 2:4] = xs.astype(np.float16).reshape(n, nb, 1).view(np.uint8)
    out[:, :, 4:] = xq.astype(np.int8).reshape(n, nb, QK8_0).view(np.uint8)
    return out.reshape(n, nb * 36)


def q8_K_to_ggml_bytes(xq: np.ndarray, d: np.ndarray, bsums: np.ndarray) -> np.ndarray:
    """Split Q8_K -> ggml block_q8_K rows (n, nb * 292) uint8: d (f32), 256 int8, 16 int16 sums."""
    n, k = xq.shape
    nb = k // QK_K
    out = np.empty((n, nb, 292), np.uint8)
    out[:, :, 0:4] = d.astype(np.float32).reshape(n, nb, 1).view(np.uint8)
    out[:, :, 4:260] = xq.astype(np.int8).reshape(n, nb, QK_K).view(np.uint8)
    out[:, :, 260:] = bsums.astype(np.int16).reshape(n, nb, 16).view(np.uint8)
    return out.reshape(n, nb * 292)
