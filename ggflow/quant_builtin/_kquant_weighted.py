"""numba kernels for the K-quant encoders given importance weights: ggml's quantize_row_q2_K_impl ..
quantize_row_q6_K_impl, byte for byte (what ggml_quantize_chunk, hence
llama-quantize with an imatrix, writes).

Same rules as ``_kquant_encoders`` (float32 in C's order, no FMA, ggml's nearest_int). Q4_K / Q5_K weigh
each element by ``qw * sqrt(sigma2 + x^2)`` (sigma2 = 2 * mean x^2 of the super-block), fit each 32-group
with make_qkx3_quants (= the weighted make_qkx2_quants), and code the 8 group scales and mins with
make_qp_quants weighted by the groups' weight sums; Q6_K fits each 16-group with make_qx_quants weighted
by qw itself; Q2_K / Q3_K are described at their drivers. Drivers: ``quantize_<type>_w(blocks, qw, out)``, blocks and qw (n_blocks, 256).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.quant_builtin._kquant_encoders import (
    GROUP_MAX_EPS, make_qkx2_quants, nearest_int, q3_scale, round_to_fp16, scale_min_k4)

f32 = np.float32


@njit(cache=True, fastmath=False)
def make_qx_quants_w(x, nmax, L, qw):
    """ggml's make_qx_quants with rmse_type 1 and weights qw: levels in [0, 2*nmax) into L; the scale."""
    n = x.size
    vmax = f32(0.0)
    amax = f32(0.0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return f32(0.0)
    iscale = f32(-nmax) / vmax
    sumlx = f32(0.0)
    suml2 = f32(0.0)
    for i in range(n):
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = l + nmax
        w = qw[i]
        fl = f32(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else f32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(f32(nmax) + f32(0.1) * f32(step)) / vmax
        sumlx = f32(0.0)
        suml2 = f32(0.0)
        for i in range(n):
            fl = f32(max(-nmax, min(nmax - 1, nearest_int(iscale * x[i]))))
            w = qw[i]
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, fastmath=False)
def make_qp_quants(x, nmax, L, qw):
    """ggml's make_qp_quants: x coded as scale * L, L in [0, nmax], weights qw. L is a uint8 array in C: a
    negative level (IQ2_XXS passes values whose sign flip was undone) is stored as 256 + l and read back so,
    while the running sums use the int; L here holds those uint8 values too."""
    n = x.size
    vmax = f32(0.0)
    for i in range(n):
        vmax = max(vmax, x[i])
    if vmax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return f32(0.0)
    iscale = f32(nmax) / vmax
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = f32(1.0) / iscale
    best_mse = f32(0.0)
    for i in range(n):
        diff = x[i] - scale * f32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (f32(0.1) * f32(step) + f32(nmax)) / vmax
        scale_is = f32(1.0) / iscale_is
        mse = f32(0.0)
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * f32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = f32(0.0)
    suml2 = f32(0.0)
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        w = qw[i]
        sumlx += w * x[i] * f32(l)
        suml2 += w * f32(l) * f32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            li = f32(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    fn = f32(new_l)
                    slx += w * x[i] * fn
                    sl2 += w * fn * fn
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else f32(0.0)


@njit(cache=True, fastmath=False)
def _fit_k4_weighted(x, qw, y, nmax, L, Laux, weights, scales, mins, sw, Ls, Lm):
    """Q4_K/Q5_K impl: y[0:16] (d, dmin, 12 scale bytes) and L (levels in 0..nmax) for one super-block."""
    sum_x2 = f32(0.0)
    for l in range(256):
        sum_x2 += x[l] * x[l]
    sigma2 = f32(2.0) * sum_x2 / f32(256.0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        for l in range(32):
            weights[l] = qw[32 * j + l] * np.sqrt(sigma2 + xs[l] * xs[l])
        sumw = f32(0.0)
        for l in range(32):
            sumw += weights[l]
        sw[j] = sumw
        scale, the_min = make_qkx2_quants(xs, weights, nmax, f32(-0.9), f32(0.05), 36, False,
                                          L[32 * j:32 * j + 32], Laux)
        scales[j] = scale
        mins[j] = the_min
    d_block = make_qp_quants(scales, 63, Ls, sw)
    m_block = make_qp_quants(mins, 63, Lm, sw)
    packed = y[4:16]
    for j in range(8):
        ls = min(63, Ls[j])
        lm = min(63, Lm[j])
        if j < 4:
            packed[j] = ls
            packed[j + 4] = lm
        else:
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            packed[j - 4] |= (ls >> 4) << 6
            packed[j] |= (lm >> 4) << 6
    d_all = round_to_fp16(y, 0, d_block)
    dmin_all = round_to_fp16(y, 2, m_block)
    for j in range(8):
        sc, m = scale_min_k4(j, packed)
        d = d_all * f32(sc)
        if d == 0:
            continue
        dm = dmin_all * f32(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int((x[32 * j + ii] + dm) / d)))


@njit(cache=True, fastmath=False)
def quantize_q4_k_w(blocks, qw, out):
    L, Laux, Ls, Lm = np.empty(256, np.uint8), np.empty(32, np.uint8), np.empty(8, np.int64), np.empty(8, np.int64)
    weights, scales, mins, sw = (np.empty(32, np.float32), np.empty(8, np.float32), np.empty(8, np.float32),
                                 np.empty(8, np.float32))
    for i in range(blocks.shape[0]):
        y = out[i]
        y[:] = 0
        _fit_k4_weighted(blocks[i], qw[i], y, 15, L, Laux, weights, scales, mins, sw, Ls, Lm)
        qs = y[16:144]
        for j in range(0, 256, 64):
            for l in range(32):
                qs[j // 2 + l] = L[j + l] | (L[j + l + 32] << 4)


@njit(cache=True, fastmath=False)
def quantize_q5_k_w(blocks, qw, out):
    L, Laux, Ls, Lm = np.empty(256, np.uint8), np.empty(32, np.uint8), np.empty(8, np.int64), np.empty(8, np.int64)
    weights, scales, mins, sw = (np.empty(32, np.float32), np.empty(8, np.float32), np.empty(8, np.float32),
                                 np.empty(8, np.float32))
    for i in range(blocks.shape[0]):
        y = out[i]
        y[:] = 0
        _fit_k4_weighted(blocks[i], qw[i], y, 31, L, Laux, weights, scales, mins, sw, Ls, Lm)
        qh = y[16:48]
        qs = y[48:176]
        for k in range(4):
            for j in range(32):
                l1 = L[64 * k + j]
                if l1 > 15:
                    l1 -= 16
                    qh[j] |= 1 << (2 * k)
                l2 = L[64 * k + j + 32]
                if l2 > 15:
                    l2 -= 16
                    qh[j] |= 2 << (2 * k)
                qs[32 * k + j] = l1 | (l2 << 4)


@njit(cache=True, fastmath=False)
def quantize_q6_k_w(blocks, qw, out):
    L, scales = np.empty(256, np.int8), np.empty(16, np.float32)
    for i in range(blocks.shape[0]):
        x, y = blocks[i], out[i]
        max_scale = f32(0.0)
        max_abs_scale = f32(0.0)
        for ib in range(16):
            scale = make_qx_quants_w(x[16 * ib:16 * ib + 16], 32, L[16 * ib:16 * ib + 16], qw[i, 16 * ib:16 * ib + 16])
            scales[ib] = scale
            if abs(scale) > max_abs_scale:
                max_abs_scale = abs(scale)
                max_scale = scale
        y[:] = 0
        if max_abs_scale < GROUP_MAX_EPS:
            continue
        iscale = f32(-128.0) / max_scale
        d_all = round_to_fp16(y, 208, f32(1.0) / iscale)
        sc = y[192:208]
        for ib in range(16):
            sc[ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
        for j in range(16):
            d = d_all * f32(np.int8(sc[j]))
            if d == 0:
                continue
            for ii in range(16):
                L[16 * j + ii] = max(-32, min(31, nearest_int(x[16 * j + ii] / d))) + 32
        ql = y[0:128]
        qh = y[128:192]
        for h in range(2):
            j = 128 * h
            for l in range(32):
                q1 = L[j + l] & 0xF
                q2 = L[j + l + 32] & 0xF
                q3 = L[j + l + 64] & 0xF
                q4 = L[j + l + 96] & 0xF
                ql[64 * h + l] = q1 | (q3 << 4)
                ql[64 * h + l + 32] = q2 | (q4 << 4)
                qh[32 * h + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                  | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6))


@njit(cache=True, fastmath=False)
def quantize_q2_k_w(blocks, qw, out):
    """quantize_row_q2_K_impl: block_q2_K scales[16] | qs[64] | d | dmin; 16-groups fit by make_qkx3_quants
    (weights qw * sqrt(sigma2 + x^2), sigma2 the super-block's mean square), scales and mins by make_qp_quants."""
    L, Laux, Ls, Lm = np.empty(256, np.uint8), np.empty(16, np.uint8), np.empty(16, np.int64), np.empty(16, np.int64)
    weight, scales, mins, sw = (np.empty(16, np.float32), np.empty(16, np.float32), np.empty(16, np.float32),
                                np.empty(16, np.float32))
    for i in range(blocks.shape[0]):
        x, y = blocks[i], out[i]
        y[:] = 0
        sumx2 = f32(0.0)
        for j in range(256):
            sumx2 += x[j] * x[j]
        sigma2 = sumx2 / f32(256.0)
        for j in range(16):
            for l in range(16):
                weight[l] = qw[i, 16 * j + l] * np.sqrt(sigma2 + x[16 * j + l] * x[16 * j + l])
            s = f32(0.0)
            for l in range(16):
                s += weight[l]
            sw[j] = s
            scale, the_min = make_qkx2_quants(x[16 * j:16 * j + 16], weight, 3, f32(-0.9), f32(0.05), 36, False,
                                              L[16 * j:16 * j + 16], Laux)
            scales[j] = scale
            mins[j] = the_min
        dm = make_qp_quants(scales, 15, Ls, sw)
        mm = make_qp_quants(mins, 15, Lm, sw)
        dm = round_to_fp16(y, 80, dm)
        mm = round_to_fp16(y, 82, mm)
        for j in range(16):
            y[j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
        for j in range(16):
            d = dm * f32(y[j] & 0xF)
            if d == 0:
                continue
            m = mm * f32(y[j] >> 4)
            for ii in range(16):
                L[16 * j + ii] = max(0, min(3, nearest_int((x[16 * j + ii] + m) / d)))
        for h in range(2):
            for l in range(32):
                j = 128 * h
                y[16 + 32 * h + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)


@njit(cache=True, fastmath=False)
def quantize_q3_k_w(blocks, qw, out):
    """quantize_row_q3_K_impl: block_q3_K hmask[32] | qs[64] | scales[12] | d; 16-groups fit by the weighted
    make_qx_quants (nmax 4), their scales by make_qx_quants (nmax 32) weighted by the groups' weight sums."""
    L, Ls = np.empty(256, np.int8), np.empty(16, np.int8)
    weight, scales, sw = np.empty(16, np.float32), np.empty(16, np.float32), np.empty(16, np.float32)
    for i in range(blocks.shape[0]):
        x, y = blocks[i], out[i]
        y[:] = 0
        sumx2 = f32(0.0)
        for j in range(256):
            sumx2 += x[j] * x[j]
        sigma2 = f32(2.0) * sumx2 / f32(256.0)
        for j in range(16):
            for l in range(16):
                weight[l] = qw[i, 16 * j + l] * np.sqrt(sigma2 + x[16 * j + l] * x[16 * j + l])
            s = f32(0.0)
            for l in range(16):
                s += weight[l]
            sw[j] = s
            scales[j] = make_qx_quants_w(x[16 * j:16 * j + 16], 4, L[16 * j:16 * j + 16], weight)
        d_block = make_qx_quants_w(scales, 32, Ls, sw)
        packed = y[96:108]
        for j in range(16):
            l = np.int64(Ls[j])
            if j < 8:
                packed[j] = l & 0xF
            else:
                packed[j - 8] |= (l & 0xF) << 4
            l >>= 4
            packed[j % 4 + 8] |= (l << (2 * (j // 4))) & 0xFF
        d_all = round_to_fp16(y, 108, d_block)
        for j in range(16):
            d = d_all * f32(q3_scale(packed, j))
            if d == 0:
                continue
            for ii in range(16):
                L[16 * j + ii] = max(-4, min(3, nearest_int(x[16 * j + ii] / d))) + 4
        hmask = y[0:32]
        for j in range(256):
            if L[j] > 3:
                hmask[j % 32] |= 1 << (j // 32)
                L[j] -= 4
        for h in range(2):
            for l in range(32):
                j = 128 * h
                y[32 + 32 * h + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)
