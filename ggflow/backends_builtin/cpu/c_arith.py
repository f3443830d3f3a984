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
