"""numba kernels behind the K-quant encoders: ggml's ``quantize_row_q*_K_ref``, byte for byte.

Every driver takes (n_blocks, 256) float32 and fills (n_blocks, type_size) uint8:
``quantize_<type>(blocks, out, lo, hi)`` does blocks lo..hi-1 serially, and
``quantize_<type>_parallel(blocks, out, n_chunks)`` does all of them in n_chunks threads.
Bit-exactness with ggml's C rests on a few rules followed throughout:

- C ``float`` arithmetic is float32 here too. numba widens ``float32 * int`` and
  ``float32 * <python float>`` to float64, so every integer and constant that meets a float is
  cast with ``f32(...)`` first, and ``a*b*c`` keeps C's left-to-right grouping.
- No fused multiply-add: ggml-quants.c is built without ``-mfma`` on x86-64 (it lives in
  ggml-base, which gets no ``-march``), so ``a*b + c`` rounds twice; ``fastmath=False`` keeps
  LLVM from contracting it. (With contraction, golden Q2_K/Q4_K/Q5_K/Q6_K blocks change.)
- ``nearest_int`` is ggml's 1.5*2^23 magic-number trick itself, read back through the float's
  bits, so even out-of-range arguments give what ggml gives.
- Stores into uint8/int8 fields truncate as C's implicit conversions do.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

f32 = np.float32
GROUP_MAX_EPS = np.float32(1e-15)   # ggml: a sub-block below this is "all zero"
MAGIC_ROUND = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer in the mantissa


# -- scalar helpers ------------------------------------------------------------------------
@njit(cache=True, fastmath=False)
def nearest_int(fval):
    bits = np.int64(np.float32(f32(fval) + MAGIC_ROUND).view(np.int32))
    return (bits & 0x007FFFFF) - 0x00400000


@njit(cache=True, fastmath=False)
def fp16_bits(value):
    """float32 -> IEEE half bits, round to nearest even; overflow -> inf, NaN -> quiet NaN."""
    b = np.int64(np.float32(value).view(np.int32)) & 0xFFFFFFFF
    sign = (b >> 16) & 0x8000
    exp = (b >> 23) & 0xFF
    man = b & 0x7FFFFF
    if exp == 0xFF:
        return sign | (0x7E00 if man else 0x7C00)
    e = exp - 112  # rebias 127 -> 15
    if e >= 31:
        return sign | 0x7C00
    if e <= 0:  # half subnormal (or zero): count units of 2^-24
        if e < -10:
            return sign
        man |= 0x800000
        shift = 14 - e
        r = man >> shift
        rem = man & ((1 << shift) - 1)
        half = 1 << (shift - 1)
    else:
        r = (e << 10) | (man >> 13)
        rem = man & 0x1FFF
        half = 0x1000
    if rem > half or (rem == half and (r & 1)):
        r += 1  # a carry out of the mantissa bumps the exponent, up to inf: still correct
    return sign | r


@njit(cache=True, fastmath=False)
def fp16_value(bits):
    """IEEE half bits -> float32 (exact)."""
    sign = -1.0 if bits & 0x8000 else 1.0
    exp = (bits >> 10) & 0x1F
    man = bits & 0x3FF
    if exp == 0:
        return f32(sign * man * 2.0 ** -24)
    if exp == 31:
        return f32(sign * np.inf) if man == 0 else f32(np.nan)
    return f32(sign * (1024 + man) * 2.0 ** (exp - 25))


@njit(cache=True, fastmath=False)
def round_to_fp16(y, offset, value):
    """Store ``value`` as a little-endian half at y[offset]; return the float it now reads as."""
    bits = fp16_bits(value)
    y[offset] = bits & 0xFF
    y[offset + 1] = bits >> 8
    return fp16_value(bits)


# -- scale searches (ggml-quants.c helpers of the same names) -------------------------------
@njit(cache=True, fastmath=False)
def make_qx_quants_rmse1(x, nmax, L):
    """Symmetric scale for x, weights x^2 (rmse_type 1, no importance): the Q6_K search.

    Fills L with levels in [0, 2*nmax) and returns the scale; tries 18 nudged inverse scales.
    """
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
        w = x[i] * x[i]
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
            w = x[i] * x[i]
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, fastmath=False)
def make_q3_quants_rmse(x, nmax, L):
    """Symmetric scale for x by coordinate descent on x^2-weighted error (up to 5 sweeps).

    Fills L with levels in [0, 2*nmax) and returns the scale.
    """
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
        L[i] = l
        w = x[i] * x[i]
        sumlx += w * x[i] * f32(l)
        suml2 += w * f32(l) * f32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            li = f32(L[i])
            slx = sumlx - w * x[i] * li
            if slx > 0:
                sl2 = suml2 - w * li * li
                new_l = max(-nmax, min(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    slx += w * x[i] * f32(new_l)
                    sl2 += w * f32(new_l) * f32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else f32(0.0)


@njit(cache=True, fastmath=False)
def make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep, use_mad, L, Laux):
    """Affine fit x ~ scale*L - the_min with L in [0, nmax], by a weighted least-squares search
    over nstep+1 candidate inverse scales. Returns (scale, the_min); fills L."""
    n = x.size
    vmin = x[0]
    vmax = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < vmin:
            vmin = x[i]
        if x[i] > vmax:
            vmax = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if vmin > 0:
        vmin = f32(0.0)
    if vmax == vmin:
        for i in range(n):
            L[i] = 0
        return f32(0.0), -vmin
    iscale = f32(nmax) / (vmax - vmin)
    scale = f32(1.0) / iscale
    best_error = f32(0.0)
    for i in range(n):
        l = nearest_int(iscale * (x[i] - vmin))
        L[i] = max(0, min(nmax, l))
        diff = scale * f32(L[i]) + vmin - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    if nstep < 1:
        return scale, -vmin
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * f32(step) + f32(nmax)) / (vmax - vmin)
        sum_l = f32(0.0)
        sum_l2 = f32(0.0)
        sum_xl = f32(0.0)
        for i in range(n):
            l = max(0, min(nmax, nearest_int(iscale * (x[i] - vmin))))
            Laux[i] = l
            w = weights[i]
            fl = f32(l)
            sum_l += w * fl
            sum_l2 += w * fl * fl
            sum_xl += w * fl * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = f32(0.0)
                this_scale = sum_xl / sum_l2
            cur_error = f32(0.0)
            for i in range(n):
                diff = this_scale * f32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                vmin = this_min
    return scale, -vmin


# -- packing shared by several types --------------------------------------------------------
@njit(cache=True, fastmath=False)
def pack_2bit(L, qs):
    """256 levels in 0..3 -> 64 bytes: byte 32*h + l holds elements 128*h + l + 32*k at bits 2k."""
    for j in range(0, 256, 128):
        for l in range(32):
            qs[j // 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)


@njit(cache=True, fastmath=False)
def scale_min_k4(j, scales):
    """The j-th 6-bit (scale, min) pair of the 12-byte Q4_K/Q5_K packing."""
    if j < 4:
        return scales[j] & 63, scales[j + 4] & 63
    return ((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))


@njit(cache=True, fastmath=False)
def fit_scale_min_k4(x, y, nmax, rmin, nstep, L, Laux, weights, scales, mins):
    """Q4_K/Q5_K common part: 8 affine sub-block fits, their 6-bit scales and mins packed into
    y[4:16] with d, dmin at y[0:4], then L (256 levels in 0..nmax) requantized against them."""
    max_scale = f32(0.0)
    max_min = f32(0.0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = f32(0.0)
        for l in range(32):
            sum_x2 += xs[l] * xs[l]
        av_x = np.sqrt(sum_x2 / f32(32))
        for l in range(32):
            weights[l] = av_x + abs(xs[l])
        scale, the_min = make_qkx2_quants(xs, weights, nmax, rmin, f32(0.1), nstep, False,
                                          L[32 * j:32 * j + 32], Laux)
        scales[j] = scale
        mins[j] = the_min
        if scale > max_scale:
            max_scale = scale
        if the_min > max_min:
            max_min = the_min
    inv_scale = f32(63.0) / max_scale if max_scale > 0 else f32(0.0)
    inv_min = f32(63.0) / max_min if max_min > 0 else f32(0.0)
    packed = y[4:16]
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)  # C: uint8_t ls = nearest_int(..)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            packed[j] = ls
            packed[j + 4] = lm
        else:
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            packed[j - 4] |= (ls >> 4) << 6
            packed[j] |= (lm >> 4) << 6
    d_all = round_to_fp16(y, 0, max_scale / f32(63.0))
    dmin_all = round_to_fp16(y, 2, max_min / f32(63.0))
    for j in range(8):
        sc, m = scale_min_k4(j, packed)
        d = d_all * f32(sc)
        if d == 0:
            continue
        dm = dmin_all * f32(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int((x[32 * j + ii] + dm) / d)))


# -- one block of each type ------------------------------------------------------------------
@njit(cache=True, fastmath=False)
def quantize_block_q2_k(x, y, L, Laux, weights, scales, mins):
    """block_q2_K: scales[16] | qs[64] | d (f16) | dmin (f16)."""
    q4scale = f32(15.0)
    max_scale = f32(0.0)
    max_min = f32(0.0)
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        for l in range(16):
            weights[l] = abs(xs[l])
        scale, the_min = make_qkx2_quants(xs, weights[:16], 3, f32(-0.5), f32(0.1), 15, True,
                                          L[16 * j:16 * j + 16], Laux)
        scales[j] = scale
        mins[j] = the_min
        if scale > max_scale:
            max_scale = scale
        if the_min > max_min:
            max_min = the_min
    packed = y[0:16]
    if max_scale > 0:
        iscale = q4scale / max_scale
        for j in range(16):
            packed[j] = nearest_int(iscale * scales[j]) & 0xFF
        d_all = round_to_fp16(y, 80, max_scale / q4scale)
    else:
        for j in range(16):
            packed[j] = 0
        d_all = round_to_fp16(y, 80, f32(0.0))
    if max_min > 0:
        iscale = q4scale / max_min
        for j in range(16):
            packed[j] = (packed[j] | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
        dmin_all = round_to_fp16(y, 82, max_min / q4scale)
    else:
        dmin_all = round_to_fp16(y, 82, f32(0.0))
    for j in range(16):
        d = d_all * f32(packed[j] & 0xF)
        if d == 0:
            continue
        dm = dmin_all * f32(packed[j] >> 4)
        for ii in range(16):
            L[16 * j + ii] = max(0, min(3, nearest_int((x[16 * j + ii] + dm) / d)))
    pack_2bit(L, y[16:80])


@njit(cache=True, fastmath=False)
def q3_scale(packed, j):
    """The j-th signed 6-bit scale of block_q3_K: low nibbles in bytes 0..7, top 2 bits in 8..11."""
    low = np.int64(packed[j] & 0xF) if j < 8 else np.int64(packed[j - 8] >> 4)
    high = (np.int64(packed[8 + j % 4]) >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


@njit(cache=True, fastmath=False)
def quantize_block_q3_k(x, y, L, scales):
    """block_q3_K: hmask[32] | qs[64] | scales[12] | d (f16). L is int8 here."""
    max_scale = f32(0.0)
    amax = f32(0.0)
    for j in range(16):
        scales[j] = make_q3_quants_rmse(x[16 * j:16 * j + 16], 4, L[16 * j:16 * j + 16])
        scale = abs(scales[j])
        if scale > amax:
            amax = scale
            max_scale = scales[j]
    packed = y[96:108]
    packed[:] = 0
    if max_scale != 0:
        iscale = f32(-32.0) / max_scale
        for j in range(16):
            l = np.int64(np.int8(nearest_int(iscale * scales[j])))  # C: int8_t l = nearest_int(..)
            l = max(-32, min(31, l)) + 32
            if j < 8:
                packed[j] = l & 0xF
            else:
                packed[j - 8] |= (l & 0xF) << 4
            packed[j % 4 + 8] |= (l >> 4) << (2 * (j // 4))
        d_all = round_to_fp16(y, 108, f32(1.0) / iscale)
    else:
        d_all = round_to_fp16(y, 108, f32(0.0))
    for j in range(16):
        d = d_all * f32(q3_scale(packed, j))
        if d == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-4, min(3, nearest_int(x[16 * j + ii] / d))) + 4
    hmask = y[0:32]
    hmask[:] = 0
    for j in range(256):  # element j's high bit: byte j % 32, bit j // 32
        if L[j] > 3:
            hmask[j % 32] |= 1 << (j // 32)
            L[j] -= 4
    pack_2bit(L, y[32:96])


@njit(cache=True, fastmath=False)
def quantize_block_q4_k(x, y, L, Laux, weights, scales, mins):
    """block_q4_K: d (f16) | dmin (f16) | scales[12] | qs[128]."""
    fit_scale_min_k4(x, y, 15, f32(-1.0), 20, L, Laux, weights, scales, mins)
    qs = y[16:144]
    for j in range(0, 256, 64):
        for l in range(32):
            qs[j // 2 + l] = L[j + l] | (L[j + l + 32] << 4)


@njit(cache=True, fastmath=False)
def quantize_block_q5_k(x, y, L, Laux, weights, scales, mins):
    """block_q5_K: d (f16) | dmin (f16) | scales[12] | qh[32] | qs[128]."""
    fit_scale_min_k4(x, y, 31, f32(-0.5), 15, L, Laux, weights, scales, mins)
    qh = y[16:48]
    qs = y[48:176]
    qh[:] = 0
    for k in range(4):  # 64 elements: low nibbles / high nibbles, 5th bits at qh bits 2k, 2k+1
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
def quantize_block_q6_k(x, y, L, scales):
    """block_q6_K: ql[128] | qh[64] | scales[16] (int8) | d (f16). L is int8 here."""
    max_scale = f32(0.0)
    max_abs_scale = f32(0.0)
    for ib in range(16):
        scale = make_qx_quants_rmse1(x[16 * ib:16 * ib + 16], 32, L[16 * ib:16 * ib + 16])
        scales[ib] = scale
        if abs(scale) > max_abs_scale:
            max_abs_scale = abs(scale)
            max_scale = scale
    if max_abs_scale < GROUP_MAX_EPS:
        y[:] = 0
        return
    iscale = f32(-128.0) / max_scale
    d_all = round_to_fp16(y, 208, f32(1.0) / iscale)
    sc = y[192:208]
    for ib in range(16):
        sc[ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF  # stored as int8
    for j in range(16):
        d = d_all * f32(np.int8(sc[j]))
        if d == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-32, min(31, nearest_int(x[16 * j + ii] / d))) + 32
    ql = y[0:128]
    qh = y[128:192]
    for h in range(2):  # 128 elements: 4 runs of 32 share 64 ql bytes (nibbles) and 32 qh bytes
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
def quantize_block_q8_k(x, y):
    """block_q8_K: d (f32) | qs[256] (int8) | bsums[16] (int16, sums of 16 consecutive qs)."""
    vmax = f32(0.0)
    amax = f32(0.0)
    for j in range(256):
        ax = abs(x[j])
        if ax > amax:
            amax = ax
            vmax = x[j]
    if amax == 0:
        y[:] = 0
        return
    iscale = f32(-127.0) / vmax
    qs = y[4:260]
    for j in range(16):
        total = 0
        for ii in range(16):
            v = np.int64(np.int8(min(127, nearest_int(iscale * x[16 * j + ii]))))
            qs[16 * j + ii] = v & 0xFF
            total += v
        y[260 + 2 * j] = total & 0xFF
        y[261 + 2 * j] = (total >> 8) & 0xFF
    d_bits = np.int64(np.float32(f32(1.0) / iscale).view(np.int32))
    for k in range(4):
        y[k] = (d_bits >> (8 * k)) & 0xFF


# -- drivers: a serial one over a range of blocks, and a parallel one over chunks of it -----------
# A parallel region costs a thread wake-up (10-20 us idle, milliseconds on a busy machine), so
# small inputs take the serial driver; large ones split into n_chunks contiguous ranges, each
# with its own scratch buffers. Blocks are independent, so the split cannot change a byte.
@njit(cache=True, fastmath=False)
def chunk_bounds(n_blocks, n_chunks, c):
    return c * n_blocks // n_chunks, (c + 1) * n_blocks // n_chunks


@njit(cache=True, fastmath=False)
def quantize_q2_k(blocks, out, lo, hi):
    L, Laux = np.empty(256, np.uint8), np.empty(16, np.uint8)
    weights, scales, mins = np.empty(16, np.float32), np.empty(16, np.float32), np.empty(16, np.float32)
    for i in range(lo, hi):
        quantize_block_q2_k(blocks[i], out[i], L, Laux, weights, scales, mins)


@njit(cache=True, fastmath=False)
def quantize_q3_k(blocks, out, lo, hi):
    L, scales = np.empty(256, np.int8), np.empty(16, np.float32)
    for i in range(lo, hi):
        quantize_block_q3_k(blocks[i], out[i], L, scales)


@njit(cache=True, fastmath=False)
def quantize_q4_k(blocks, out, lo, hi):
    L, Laux = np.empty(256, np.uint8), np.empty(32, np.uint8)
    weights, scales, mins = np.empty(32, np.float32), np.empty(8, np.float32), np.empty(8, np.float32)
    for i in range(lo, hi):
        quantize_block_q4_k(blocks[i], out[i], L, Laux, weights, scales, mins)


@njit(cache=True, fastmath=False)
def quantize_q5_k(blocks, out, lo, hi):
    L, Laux = np.empty(256, np.uint8), np.empty(32, np.uint8)
    weights, scales, mins = np.empty(32, np.float32), np.empty(8, np.float32), np.empty(8, np.float32)
    for i in range(lo, hi):
        quantize_block_q5_k(blocks[i], out[i], L, Laux, weights, scales, mins)


@njit(cache=True, fastmath=False)
def quantize_q6_k(blocks, out, lo, hi):
    L, scales = np.empty(256, np.int8), np.empty(16, np.float32)
    for i in range(lo, hi):
        quantize_block_q6_k(blocks[i], out[i], L, scales)


@njit(cache=True, fastmath=False)
def quantize_q8_k(blocks, out, lo, hi):
    for i in range(lo, hi):
        quantize_block_q8_k(blocks[i], out[i])


@njit(cache=True, fastmath=False, parallel=True)
def quantize_q2_k_parallel(blocks, out, n_chunks):
    for c in prange(n_chunks):
        lo, hi = chunk_bounds(blocks.shape[0], n_chunks, c)
        quantize_q2_k(blocks, out, lo, hi)


@njit(cache=True, fastmath=False, parallel=True)
def quantize_q3_k_parallel(blocks, out, n_chunks):
    for c in prange(n_chunks):
        lo, hi = chunk_bounds(blocks.shape[0], n_chunks, c)
        quantize_q3_k(blocks, out, lo, hi)


@njit(cache=True, fastmath=False, parallel=True)
def quantize_q4_k_parallel(blocks, out, n_chunks):
    for c in prange(n_chunks):
        lo, hi = chunk_bounds(blocks.shape[0], n_chunks, c)
        quantize_q4_k(blocks, out, lo, hi)


@njit(cache=True, fastmath=False, parallel=True)
def quantize_q5_k_parallel(blocks, out, n_chunks):
    for c in prange(n_chunks):
        lo, hi = chunk_bounds(blocks.shape[0], n_chunks, c)
        quantize_q5_k(blocks, out, lo, hi)


@njit(cache=True, fastmath=False, parallel=True)
def quantize_q6_k_parallel(blocks, out, n_chunks):
    for c in prange(n_chunks):
        lo, hi = chunk_bounds(blocks.shape[0], n_chunks, c)
        quantize_q6_k(blocks, out, lo, hi)


@njit(cache=True, fastmath=False, parallel=True)
def quantize_q8_k_parallel(blocks, out, n_chunks):
    for c in prange(n_chunks):
        lo, hi = chunk_bounds(blocks.shape[0], n_chunks, c)
        quantize_q8_k(blocks, out, lo, hi)
