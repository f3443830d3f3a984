"""numba kernels behind the IQ4_NL and IQ4_XS encoders: ggml's quantize_row_iq4_nl_impl, byte for byte.

One routine serves both types (as in ggml): per 32-element group, the scale that maps the element of
largest magnitude to the table's end, refined by weighted least squares over 2*ntry + 1 nearby
scales; IQ4_XS then codes the group scales in 6 bits against an fp16 super-scale and re-picks every
index with the coded scale. Weights are x^2, or ``qw * sqrt(sigma2 + x^2)`` given importance weights
qw. Float arithmetic follows C's float32 order, without FMA (see ``_kquant_encoders``).

Entry points (blocks: (n, block_size) float32; quant_weights: the same shape, or None):
  ``quantize_iq4_nl(blocks, quant_weights=None, ntry=7)`` -- ntry=7 is ggml_quantize_chunk's call
  (what llama-quantize writes); ntry=-1 is quantize_row_iq4_nl_ref's.
  ``quantize_iq4_xs(blocks, quant_weights=None)`` -- quantize_iq4_xs, = quantize_row_iq4_xs_ref.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.errors import QuantizationError
from ggflow.quant_builtin._blocks import check_float_blocks, require_finite
from ggflow.quant_builtin._iq_grids import KVALUES_IQ4NL
from ggflow.quant_builtin._kquant_encoders import GROUP_MAX_EPS, nearest_int, round_to_fp16

f32 = np.float32


@njit(cache=True, fastmath=False)
def best_index_int8(values, x):
    """Index of the table value nearest x; the lower one on ties (ggml's binary search)."""
    n = values.shape[0]
    if x <= f32(values[0]):
        return 0
    if x >= f32(values[n - 1]):
        return n - 1
    ml, mu = 0, n - 1
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < f32(values[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if f32(x - f32(values[mu - 1])) < f32(f32(values[mu]) - x) else mu


@njit(cache=True, fastmath=False)
def _group_sums(xb, weight, values, L, ib, bs, idv, store):
    sumqx = f32(0)
    sumq2 = f32(0)
    for j in range(bs):
        al = f32(idv * xb[j])
        l = best_index_int8(values, al)
        if store:
            L[ib * bs + j] = l
        q = f32(values[l])
        w = weight[j]
        sumqx = f32(sumqx + f32(f32(w * q) * xb[j]))
        sumq2 = f32(sumq2 + f32(f32(w * q) * q))
    return sumqx, sumq2


@njit(cache=True, fastmath=False)
def quantize_superblock(x, qw, has_qw, sbs, values, ntry, y, L, scales, weight):
    """ggml's quantize_row_iq4_nl_impl for one super-block of sbs elements (32: IQ4_NL, 256: IQ4_XS),
    written into y (IQ4_NL: d, qs[16]; IQ4_XS: d, scales_h, scales_l[4], qs[128]). L carries over
    between calls as ggml's stack array does (it matters only for ntry < 0 and an all-zero block)."""
    bs = 32
    nb = sbs // bs
    sigma2 = f32(0)
    for j in range(sbs):
        sigma2 = f32(sigma2 + f32(x[j] * x[j]))
    sigma2 = f32(sigma2 * f32(f32(2.0) / f32(sbs)))
    max_scale = f32(0)
    amax_scale = f32(0)
    for ib in range(nb):
        xb = x[ib * bs:(ib + 1) * bs]
        for j in range(bs):
            if has_qw:
                weight[j] = f32(qw[ib * bs + j] * np.sqrt(f32(sigma2 + f32(xb[j] * xb[j]))))
            else:
                weight[j] = f32(xb[j] * xb[j])
        amax = f32(0)
        mx = f32(0)
        for j in range(bs):
            ax = abs(xb[j])
            if ax > amax:
                amax = ax
                mx = xb[j]
        if amax < GROUP_MAX_EPS:
            scales[ib] = f32(0)
            continue
        d = f32(-mx / f32(values[0])) if ntry > 0 else f32(mx / f32(values[0]))
        idv = f32(f32(1) / d)
        sumqx, sumq2 = _group_sums(xb, weight, values, L, ib, bs, idv, True)
        d = f32(sumqx / sumq2) if sumq2 > 0 else f32(0)
        best = f32(d * sumqx)
        for itry in range(-ntry, ntry + 1):
            idv = f32(f32(itry + np.int32(values[0])) / mx)
            sumqx, sumq2 = _group_sums(xb, weight, values, L, ib, bs, idv, False)
            if sumq2 > 0 and f32(sumqx * sumqx) > f32(best * sumq2):
                d = f32(sumqx / sumq2)
                best = f32(d * sumqx)
        scales[ib] = d
        abs_d = abs(d)
        if abs_d > amax_scale:
            amax_scale = abs_d
            max_scale = d
    if nb > 1:
        y[2] = 0
        y[3] = 0
        d = f32(-max_scale / f32(32))
        round_to_fp16(y, 0, d)
        idv = f32(f32(1) / d) if d != 0 else f32(0)
        scales_h = 0
        for ib in range(nb):
            l = nearest_int(f32(idv * scales[ib]))
            l = max(-32, min(31, l))
            dl = f32(d * f32(l))
            idl = f32(f32(1) / dl) if dl != 0 else f32(0)
            for j in range(bs):
                L[ib * bs + j] = best_index_int8(values, f32(idl * x[ib * bs + j]))
            l += 32
            l_l = l & 0xF
            l_h = l >> 4
            if ib % 2 == 0:
                y[4 + ib // 2] = l_l
            else:
                y[4 + ib // 2] |= l_l << 4
            scales_h |= l_h << (2 * (ib % 8))
        y[2] = scales_h & 0xFF
        y[3] = (scales_h >> 8) & 0xFF
        qs = 8
    else:
        round_to_fp16(y, 0, scales[0])
        if ntry > 0:
            idv = f32(f32(1) / scales[0]) if scales[0] != 0 else f32(0)
            for j in range(sbs):
                L[j] = best_index_int8(values, f32(idv * x[j]))
        qs = 2
    for i in range(sbs // 32):
        for j in range(16):
            y[qs + 16 * i + j] = L[32 * i + j] | (L[32 * i + 16 + j] << 4)


@njit(cache=True, fastmath=False)
def quantize_blocks(blocks, qw, has_qw, values, ntry, out):
    sbs = blocks.shape[1]
    L = np.zeros(sbs, np.uint8)
    scales = np.zeros(sbs // 32, np.float32)
    weight = np.zeros(32, np.float32)
    for i in range(blocks.shape[0]):
        quantize_superblock(blocks[i], qw[i] if has_qw else qw[0], has_qw, sbs, values, ntry, out[i],
                            L, scales, weight)


def _run(name: str, blocks: np.ndarray, quant_weights, ntry: int, block_size: int, type_size: int):
    blocks = check_float_blocks(blocks, name, block_size)
    require_finite(blocks, name)
    if quant_weights is None:
        qw, has_qw = np.zeros((1, block_size), np.float32), False
    else:
        qw = np.ascontiguousarray(quant_weights, dtype=np.float32)
        if qw.shape != blocks.shape:
            raise QuantizationError(f"{name}: importance weights of shape {qw.shape} for blocks of shape "
                                    f"{blocks.shape}; they must match element for element")
        has_qw = True
    out = np.zeros((blocks.shape[0], type_size), np.uint8)
    quantize_blocks(blocks, qw, has_qw, KVALUES_IQ4NL, ntry, out)
    return out


def quantize_iq4_nl(blocks: np.ndarray, quant_weights=None, ntry: int = 7) -> np.ndarray:
    return _run("IQ4_NL", blocks, quant_weights, ntry, 32, 18)


def quantize_iq4_xs(blocks: np.ndarray, quant_weights=None) -> np.ndarray:
    return _run("IQ4_XS", blocks, quant_weights, 7, 256, 136)
