"""RoPE (normal and neox modes, YaRN, freq_factors), in numba, in ggml's float32 arithmetic.

For a token at position p, pair k (k < n_dims/2) turns by theta_k = p * theta_scale^k with
theta_scale = powf(freq_base, -2/n_dims); like ggml we build theta_k by repeated float32 multiplication,
not by a power, since that is where the two would part ways in the last bits. freq_factors divide
theta_k (llama 3 rope scaling). YaRN (ggml's rope_yarn) blends the interpolated angle freq_scale*theta
with the extrapolated one by a ramp over the pair index between the correction dims, and scales the
magnitude by 1 + 0.1*ln(1/freq_scale) when ext_factor != 0; attn_factor scales cos and sin.

Normal mode rotates adjacent pairs (x[2k], x[2k+1]), neox mode rotates halves (x[k], x[k + n_dims/2]).
Channels from n_dims on pass through. ggml compiles its rotation with FMA contraction where the compiler
chooses to; we round each product, so a result can differ from ggml's in its last float bit.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, to_f32
from ggflow.core.ops import ROPE_NEOX
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


@njit("float32(int64, int64, float32, float32)", cache=True, fastmath=False, error_model="numpy")
def yarn_corr_dim(n_dims, n_ctx_orig, n_rot, base):
    """ggml_rope_yarn_corr_dim: the dim at which a pair turns n_rot times over the original context."""
    two = np.float32(2.0)
    turns = np.float32(n_ctx_orig) / (n_rot * two * np.float32(np.pi))
    return np.float32(n_dims) * np.log(turns) / (two * np.log(base))


@njit("UniTuple(float32, 2)(int64, int64, float32, float32, float32)", cache=True, fastmath=False,
      error_model="numpy")
def yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow):
    """ggml_rope_yarn_corr_dims: [floor(dim(beta_fast)) clamped at 0, ceil(dim(beta_slow)) at n_dims-1]."""
    start = np.floor(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base))
    end = np.ceil(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base))
    low = start if start > np.float32(0.0) else np.float32(0.0)
    last = np.float32(n_dims - 1)
    high = end if end < last else last
    return low, high


@njit("void(float32[:], float32[:], float32, int32, float32[:], boolean, float32, float32, float32,"
      " float32, float32, float32)", cache=True, fastmath=False, error_model="numpy")
def rope_cos_sin(cos_out, sin_out, theta_scale, position, freq_factors, has_freq_factors, freq_scale,
                 ext_factor, attn_factor, yarn_mscale, corr_low, corr_high):
    """ggml_rope_cache_init for one position: cos/sin (times the magnitude scale) of every pair."""
    one = np.float32(1.0)
    theta = np.float32(position)
    ramp_width = corr_high - corr_low
    if ramp_width < np.float32(0.001):
        ramp_width = np.float32(0.001)
    for k in range(cos_out.shape[0]):
        extrap = theta / freq_factors[k] if has_freq_factors else theta
        interp = freq_scale * extrap
        angle = interp
        mscale = attn_factor
        if ext_factor != np.float32(0.0):
            y = (np.float32(k) - corr_low) / ramp_width
            ramp = one - min(one, max(np.float32(0.0), y))
            mix = ramp * ext_factor
            angle = interp * (one - mix) + extrap * mix
            mscale = attn_factor * yarn_mscale
        cos_out[k] = np.cos(angle) * mscale
        sin_out[k] = np.sin(angle) * mscale
        theta = theta * theta_scale


@njit("void(float32[:, :, :, :], int32[:], float32[:], boolean, float32[:, :, :, :], int64, boolean, int64,"
      " float32, float32, float32, float32, float32, float32)",
      cache=True, parallel=True, fastmath=False, error_model="numpy")
def rope_rows(x, positions, freq_factors, has_freq_factors, y, n_dims, neox, n_ctx_orig, freq_base,
              freq_scale, ext_factor, attn_factor, beta_fast, beta_slow):
    """x, y: (n3, n_tokens, n_head, head_dim); positions: one per token."""
    n3, n2, n1, n0 = x.shape
    half = n_dims // 2
    theta_scale = freq_base ** (np.float32(-2.0) / np.float32(n_dims))
    corr_low, corr_high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    yarn_mscale = np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / freq_scale)
    for t in prange(n3 * n2):
        i3, i2 = t // n2, t % n2
        cos_t = np.empty(half, dtype=np.float32)
        sin_t = np.empty(half, dtype=np.float32)
        rope_cos_sin(cos_t, sin_t, theta_scale, positions[i2], freq_factors, has_freq_factors, freq_scale,
                     ext_factor, attn_factor, yarn_mscale, corr_low, corr_high)
        for i1 in range(n1):
            for k in range(half):
                a = k if neox else 2 * k
                b = k + half if neox else 2 * k + 1
                x0 = x[i3, i2, i1, a]
                x1 = x[i3, i2, i1, b]
                y[i3, i2, i1, a] = x0 * cos_t[k] - x1 * sin_t[k]
                y[i3, i2, i1, b] = x0 * sin_t[k] + x1 * cos_t[k]
            for i0 in range(n_dims, n0):
                y[i3, i2, i1, i0] = x[i3, i2, i1, i0]


def bind_rope(node: Tensor, arrays: TensorArrays) -> Kernel:
    a, positions = node.src[:2]
    n_dims, mode, n_ctx_orig = node.op_params[:3]
    floats = tuple(np.float32(p) for p in node.op_params[3:9])  # base, scale, ext, attn, beta_fast, beta_slow
    a_view = arrays.view(a)
    pos_view = arrays.view(positions)[0, 0, 0, : a.ne[2]]   # indexing, unlike reshape, never copies
    if len(node.src) > 2:
        ff = node.src[2]
        factors_view, has_factors = arrays.view(ff)[0, 0, 0, : n_dims // 2], True
    else:
        ff, factors_view, has_factors = None, np.ones(1, dtype=F32), False
    read_factors_as_is = ff is None or ff.type.name == "F32"   # ggml's case; F16 is converted per run
    target = F32Target(arrays.view(node), node)
    y = target.array
    neox = mode == ROPE_NEOX

    def run() -> None:
        factors = factors_view if read_factors_as_is else to_f32(factors_view, ff.type)
        rope_rows(to_f32(a_view, a.type), pos_view, factors, has_factors, y, n_dims, neox, n_ctx_orig, *floats)
        target.flush()
    return run
