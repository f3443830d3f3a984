"""RoPE (normal and neox modes, YaRN, freq_factors), in numba, in ggml's float32 arithmetic.

For a token at position p, pair k (k < n_dims/2) turns by theta_k = p * theta_scale^k with
theta_scale = powf(freq_base, -2/n_dims); like ggml we build theta_k by repeated float32 multiplication,
not by a power, since that is where the two would part ways in the last bits. freq_factors divide
theta_k (llama 3 rope scaling). YaRN (ggml's rope_yarn) blends the interpolated angle freq_scale*theta
with the extrapolated one by a ramp over the pair index between the correction dims, and scales the
magnitude by 1 + 0.1*ln(1/freq_scale) when ext_factor != 0; attn_factor scales cos and sin.

Normal mode rotates adjacent pairs (x[2k], x[2k+1]), neox mode rotates halves (x[k], x[k + n_dims/2]).
Channels from n_dims on pass through. The rotation and YaRN's blend use fused multiply-adds where GCC
contracts ggml's C (see c_arith): with libm's cosf/sinf/powf/logf that makes the results bit-exact with
a native ggml build (checked for both modes, with and without YaRN). A build without FMA rounds each
product instead: the last float bit then differs in about a quarter of the values.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from ggflow.backends_builtin.cpu import entry_points
from ggflow.backends_builtin.cpu.arrays import F32, F32Target, TensorArrays, to_f32
from ggflow.backends_builtin.cpu.c_arith import fma_f32
from ggflow.backends_builtin.cpu.threads import driver_for
from ggflow.core.ops import ROPE_NEOX
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def yarn_corr_dim(n_dims, n_ctx_orig, n_rot, base):
    """ggml_rope_yarn_corr_dim: the dim at which a pair turns n_rot times over the original context."""
    two = np.float32(2.0)
    turns = np.float32(n_ctx_orig) / (n_rot * two * np.float32(np.pi))
    return np.float32(n_dims) * np.log(turns) / (two * np.log(base))


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow):
    """ggml_rope_yarn_corr_dims: [floor(dim(beta_fast)) clamped at 0, ceil(dim(beta_slow)) at n_dims-1]."""
    start = np.floor(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base))
    end = np.ceil(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base))
    low = start if start > np.float32(0.0) else np.float32(0.0)
    last = np.float32(n_dims - 1)
    high = end if end < last else last
    return low, high


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rope_cache(positions, freq_factors, has_freq_factors, n_dims, n_ctx_orig, freq_base, freq_scale,
               ext_factor, attn_factor, beta_fast, beta_slow):
    """ggml_rope_cache_init for every token: cos and sin (times the magnitude scale), (n_tokens, n_dims/2)."""
    cos = np.empty((positions.shape[0], n_dims // 2), dtype=np.float32)
    sin = np.empty((positions.shape[0], n_dims // 2), dtype=np.float32)
    rope_cache_into(positions, freq_factors, has_freq_factors, n_dims, n_ctx_orig, freq_base, freq_scale,
                    ext_factor, attn_factor, beta_fast, beta_slow, cos, sin)
    return cos, sin


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rope_cache_into(positions, freq_factors, has_freq_factors, n_dims, n_ctx_orig, freq_base, freq_scale,
                    ext_factor, attn_factor, beta_fast, beta_slow, cos, sin):
    """rope_cache into the arrays cos and sin, (n_tokens, n_dims/2): a plan's tables, filled at every run."""
    one = np.float32(1.0)
    half = n_dims // 2
    theta_scale = freq_base ** (np.float32(-2.0) / np.float32(n_dims))
    corr_low, corr_high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    ramp_width = max(np.float32(0.001), corr_high - corr_low)
    yarn_mscale = attn_factor * fma_f32(np.float32(0.1), np.log(one / freq_scale), one)
    for t in range(positions.shape[0]):
        theta = np.float32(positions[t])
        for k in range(half):
            extrap = theta / freq_factors[k] if has_freq_factors else theta
            interp = freq_scale * extrap
            angle, mscale = interp, attn_factor
            if ext_factor != np.float32(0.0):
                ramp = one - min(one, max(np.float32(0.0), (np.float32(k) - corr_low) / ramp_width))
                mix = ramp * ext_factor
                angle, mscale = fma_f32(interp, one - mix, extrap * mix), yarn_mscale
            cos[t, k] = np.cos(angle) * mscale
            sin[t, k] = np.sin(angle) * mscale
            theta = theta * theta_scale


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rotate_token(x, cos, sin, y, neox):
    """x, y: (n_head, head_dim) of one token; cos, sin: (n_dims/2,)."""
    half = cos.shape[0]
    for h in range(x.shape[0]):
        for k in range(half):
            a = k if neox else 2 * k
            b = k + half if neox else 2 * k + 1
            x0, x1 = x[h, a], x[h, b]
            y[h, a] = fma_f32(x0, cos[k], -(x1 * sin[k]))
            y[h, b] = fma_f32(x0, sin[k], x1 * cos[k])
        for i in range(2 * half, x.shape[1]):
            y[h, i] = x[h, i]


@njit(cache=True, nogil=True, parallel=True, fastmath=False, error_model="numpy")
def rotate_parallel(x, cos, sin, y, neox):  # x, y: (n3, n_tokens, n_head, head_dim)
    n3, n2 = x.shape[0], x.shape[1]
    for r in prange(n3 * n2):
        i3, i2 = r // n2, r % n2
        rotate_token(x[i3, i2], cos[i2], sin[i2], y[i3, i2], neox)


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rotate_serial(x, cos, sin, y, neox):
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            rotate_token(x[i3, i2], cos[i2], sin[i2], y[i3, i2], neox)


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
    rotate = driver_for(node.nelements, rotate_parallel, rotate_serial)
    (cos, sin), computes = _tables_for(node, arrays, n_dims)
    fill_args = (pos_view, factors_view, has_factors, n_dims, n_ctx_orig, *floats, cos, sin)
    if not computes:
        fill = None
    elif read_factors_as_is:
        fill = entry_points.bind(rope_cache_into, *fill_args)
    else:
        fill = lambda: rope_cache_into(pos_view, to_f32(factors_view, ff.type), *fill_args[2:])   # noqa: E731
    if a.type.name == "F32":
        turn = entry_points.bind(rotate, a_view, cos, sin, y, neox)
    else:
        turn = lambda: rotate(to_f32(a_view, a.type), cos, sin, y, neox)   # noqa: E731

    def run() -> None:
        if computes:
            fill()
        turn()
        target.flush()
    return run


def _tables_for(node: Tensor, arrays: TensorArrays, n_dims: int) -> tuple[tuple[np.ndarray, np.ndarray], bool]:
    """The (cos, sin) tables this node reads, and whether its kernel fills them (at every run).

    Every rope of a plan over the same positions with the same parameters (Q and K of each of a model's
    layers) turns by the same angles: the first of them computes the tables, the rest read them. That
    holds while nothing in the plan writes the positions or the frequency factors between them: they
    must be leaves (graph inputs, weights), which no node of a graph computes."""
    shape = (node.src[0].ne[2], n_dims // 2)
    sources = node.src[1:]
    if not all(s.is_leaf and s.view_src is None for s in sources):
        return (np.empty(shape, F32), np.empty(shape, F32)), True
    key = ("rope", *sources, node.src[0].ne[2], tuple(node.op_params))
    tables = arrays.shared.get(key)
    if tables is None:
        tables = arrays.shared[key] = (np.empty(shape, F32), np.empty(shape, F32))
        return tables, True
    return tables, False
