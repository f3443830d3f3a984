"""Float arithmetic as GCC compiles ggml's C on a machine with FMA (llama.cpp's default native build).

GCC contracts ``a*b + c`` into one fused multiply-add (its default -ffp-contract=fast) wherever a
product feeds an addition, so ggml rounds once where plain float32 code rounds twice. Where that changes
results we care about (RoPE's rotation and YaRN angle, the GELU table), the kernels call ``fma_f32``;
checked against a native ggml build, they then agree bit for bit.

numba has no fma intrinsic, so ``fma_f32`` computes in float64 and rounds once to float32: the product
of two floats is exact in float64, the sum rounds there first, so it differs from a true fma only when
that double rounding lands on a float32 tie (about once in 2^29 operations).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, fastmath=False, error_model="numpy")
def fma_f32(a, b, c):
    """float32(a*b + c) rounded once, as C's fmaf."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@njit(cache=True, fastmath=False)
def f32_bits_to_f16_bits(bits):
    """IEEE float32 -> float16, rounded to nearest even, on the bit patterns (uint32 -> int): numba has no
    float16, and this is the conversion numpy's astype(float16) and ggml's F16C path make, so a kernel
    can write an F16 tensor itself (all 2^32 patterns checked against numpy's). NaN keeps the top of its
    payload, made nonzero where that is all zeros (numpy's rule: a NaN never becomes inf)."""
    b = np.int64(bits)
    sign = (b >> 16) & 0x8000
    exponent = (b >> 23) & 0xFF
    mantissa = b & 0x7FFFFF
    if exponent == 0xFF:
        return sign | 0x7C00 | (mantissa >> 13 if mantissa >> 13 else min(mantissa, 1))
    e = exponent - 112                       # the float16 exponent field (bias 15 against 127)
    if e >= 31:
        return sign | 0x7C00                 # beyond float16's range: inf
    if e <= 0:                               # a float16 subnormal (or zero)
        if e < -10:
            return sign                      # below half the smallest subnormal: zero
        m = mantissa | 0x800000
        shift = 14 - e
        q, rem, half = m >> shift, m & ((1 << shift) - 1), 1 << (shift - 1)
    else:
        q, rem, half = (e << 10) | (mantissa >> 13), mantissa & 0x1FFF, 0x1000
    if rem > half or (rem == half and q & 1):
        q += 1                               # a carry into the exponent is right (up to inf)
    return sign | q
