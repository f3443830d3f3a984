"""Matmul pieces of the 256-element super-block types Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (activations Q8_K).

Same scheme as ``qmm.legacy``: row-tiled layout, an int16-only loop that forms sums of products
over groups small enough for int16, then a loop that applies the integer sub-block scales in int32
and the super-block scales in f32. The integers are ggml's; where ggml's quant is signed through an
offset (Q3_K's -4) the offset comes out through the Q8_K ``bsums`` (sums of 16 activations).

Packing keeps the quant bytes (as uint16 words, two bytes of a row per lane; Q3_K-Q6_K as 32-bit
words, four bytes of a row per lane, which their products of up to 64 tokens read as byte quads in place:
``block_quads``, ``qmm.quads.word_quad_sums``) and unpacks the 6-bit
scale/min fields into one byte each, and the f16 super-block scales into f32 (memory: Q3_K +38
bytes per 110, its quants being repacked as nibbles (see _q3_as_nibbles); Q4_K/Q5_K +4+4 per
144/176, Q2_K +4 per 84, Q6_K +2 per 210).

Group sizes (products that fit int16, activations |x| <= 127):
  Q2_K quant 0..3: 16 (one scale group)   Q3_K 0..7 (repacked as nibbles): 16
  Q4_K 0..15: 16   Q5_K 0..31: 8           Q6_K -32..31 (signed): 8

Helpers are inlined into the skeleton (``qmm.template``, numba IR inlining): compiled on their own, LLVM keeps
their j loops rolled and does not vectorize the row loops. Bit fields go through the 16-bit
intrinsics of ``qmm.int16``; Q5_K and Q6_K call their helpers with literal chunk numbers, which let
LLVM fold the shifts (4-14% faster than loops, at some compile time).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.products.qmm.int16 import bit_to, field, half_word, word_pair
from ggflow.backends_builtin.cpu.products.qmm.floats import f16_bits_to_f32
from ggflow.backends_builtin.cpu.products.qmm.prefetch import prefetch_slice
from ggflow.backends_builtin.cpu.products.qmm.layout import check_tile, f16_bits, f16_field, tile_rows
from ggflow.backends_builtin.cpu.products.qmm.quads import quads_add_in_int32, word_quad_sums
from ggflow.plugins.cpu_pieces import BlockPieces

F32 = np.float32
I16 = np.int16
I32 = np.int32
U32 = np.uint32
R = 64     # rows per tile, a compile-time constant of every piece here (see qmm.layout.TILE)
check_tile(R, __name__)
QK = 256
# prefetch_slice's ahead_bytes for the block after the current one: any distance up to a block's bytes asks
# for the next block, and the block sums ask for it a quarter at a time (qmm.prefetch)
NEXT_BLOCK = 1


# ---------------------------------------------------------------------------------------------- packing
def _words(blocks: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    return tile_rows(np.ascontiguousarray(blocks[:, :, start:start + nbytes]).view(np.uint16))


def _words32(blocks: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    """Quant bytes as 32-bit words, four bytes of a row a lane (int32: what word_quad_sums reads)."""
    return tile_rows(np.ascontiguousarray(blocks[:, :, start:start + nbytes]).view(np.int32))


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K/Q5_K's 12 scale bytes (rows, nb, 12) into 8 six-bit scales and 8 mins each."""
    s = s.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _q3_scales(s: np.ndarray) -> np.ndarray:
    """Unpack Q3_K's 12 scale bytes into 16 signed scales (six bits, minus 32)."""
    j = np.arange(16)
    low = np.where(j < 8, s[..., j % 8] & 0xF, s[..., j % 8] >> 4)
    high = (s[..., 8 + j % 4] >> (2 * (j // 4))) & 3
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


def pack_q2_k(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // QK, 84)
    return (_words(blocks, 16, 64), tile_rows(np.ascontiguousarray(blocks[:, :, 0:16])),
            tile_rows(f16_bits(blocks, 80)), tile_rows(f16_bits(blocks, 82)))


def _q3_as_nibbles(blocks: np.ndarray) -> np.ndarray:
    """Q3_K's quants as unsigned u = q + 4 (0..7: 2 low bits | high bit << 2), stored as nibbles in
    Q4_K's order (byte 32c + l: element 64c + l low, 64c + 32 + l high), as Q4_K's 32-bit words.

    Element 128h + 32s + l has its 2 low bits at shift 2s of qs byte 32h + l and its high bit at
    bit 4h + s of hmask byte l. Cutting those out costs the kernel more than twice what a nibble
    does, so the load-time repack spends 32 more bytes per 256 weights (128 instead of 96) on it.
    """
    rows, nb, _ = blocks.shape
    qs = blocks[:, :, 32:96].reshape(rows, nb, 2, 32)                     # [h, l]
    hmask = blocks[:, :, 0:32]                                           # [l]
    u = np.empty((rows, nb, 2, 4, 32), np.uint8)                         # [h, s, l] -> 128h + 32s + l
    for h in range(2):           # 8 whole-array steps in uint8 (numpy would widen to int64 otherwise)
        for s in range(4):
            u[:, :, h, s] = ((qs[:, :, h] >> np.uint8(2 * s)) & np.uint8(3)) | (
                ((hmask >> np.uint8(4 * h + s)) & np.uint8(1)) << np.uint8(2))
    u = u.reshape(rows, nb, 4, 2, 32)                                    # [c, lo/hi, l] -> 64c + 32hi + l
    nibbles = u[:, :, :, 0, :] | (u[:, :, :, 1, :] << np.uint8(4))
    return tile_rows(np.ascontiguousarray(nibbles.reshape(rows, nb, 128)).view(np.int32))


def pack_q3_k(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // QK, 110)
    return _q3_as_nibbles(blocks), tile_rows(_q3_scales(blocks[:, :, 96:108])), tile_rows(f16_bits(blocks, 108))


def pack_q4_k(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // QK, 144)
    sc, mn = _k4_scales_mins(blocks[:, :, 4:16])
    return (_words32(blocks, 16, 128), tile_rows(sc), tile_rows(mn), tile_rows(f16_bits(blocks, 0)),
            tile_rows(f16_bits(blocks, 2)))


def pack_q5_k(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // QK, 176)
    sc, mn = _k4_scales_mins(blocks[:, :, 4:16])
    return (_words32(blocks, 48, 128), _words32(blocks, 16, 32), tile_rows(sc), tile_rows(mn),
            tile_rows(f16_bits(blocks, 0)), tile_rows(f16_bits(blocks, 2)))


def pack_q6_k(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // QK, 210)
    return (_words32(blocks, 0, 128), _words32(blocks, 128, 64),
            tile_rows(np.ascontiguousarray(blocks[:, :, 192:208]).view(np.int8)),
            tile_rows(f16_field(blocks, 208)))   # as f32: widening it in accumulate cost Q6_K's matvec 4-5%


# ---------------------------------------------------------------------------------------- bit helpers
# (v >> shift) & mask and "bit src to bit dst" on int16, as LLVM intrinsics: no numba inlining
# at each of their hundreds of call sites, and 16-bit shifts even for run-time amounts
_bits = field
_bit_to = bit_to


# -------------------------------------------------------------------------------------- Q2_K phase 1
# qs word m (0..31) holds bytes 2m, 2m+1: with h = m // 16 and l = 2m % 32 (+1 for the high byte),
# the four 2-bit fields at shift 2s are elements 128h + 32s + l, all in scale group 8h + 2s + l // 16.
# Words 8q .. 8q+7 therefore feed the four groups 8h + 2s + (q % 2), s = 0..3, with h = q // 2.

@njit(cache=True, inline="always")
def _sum_q2_segment(qs, t, b, xq, i, o, q, part):
    h = q // 2
    for r in range(R):
        a0 = I16(0)
        a1 = I16(0)
        a2 = I16(0)
        a3 = I16(0)
        for mm in range(8):
            m = 8 * q + mm
            v = I16(qs[t, b, m, r])
            e = o + 128 * h + (2 * m) % 32
            a0 = I16(a0 + _bits(v, 0, 3) * xq[i, e] + _bits(v, 8, 3) * xq[i, e + 1])
            a1 = I16(a1 + _bits(v, 2, 3) * xq[i, e + 32] + _bits(v, 10, 3) * xq[i, e + 33])
            a2 = I16(a2 + _bits(v, 4, 3) * xq[i, e + 64] + _bits(v, 12, 3) * xq[i, e + 65])
            a3 = I16(a3 + _bits(v, 6, 3) * xq[i, e + 96] + _bits(v, 14, 3) * xq[i, e + 97])
        g = 8 * h + q % 2
        part[g, r] = a0
        part[g + 2, r] = a1
        part[g + 4, r] = a2
        part[g + 6, r] = a3


# -------------------------------------------------------------------------------- Q4_K / Q5_K phase 1
# Q4_K's (and Q3_K's repacked) qs are 32-bit words: word m (0..31) holds bytes 4m .. 4m+3 of chunk c = m // 8
# at l = 4m % 32: low nibbles are elements 64c + l .. (sub-block 2c), high nibbles 64c + 32 + l .. (2c + 1).
# Products of up to 64 tokens read them as byte quads (word_quad_sums); the int16 path below
# takes each word's two 16-bit halves (it runs only where the quads do not: see batch_path).

@njit(cache=True, inline="always")
def _sum_q4k_half(qs, t, b, xq, i, o, c, hf, part):
    """Groups of 16: part[4c + hf] (sub-block 2c, l in 16hf..16hf+15), part[4c + 2 + hf] (2c + 1)."""
    for r in range(R):
        lo = I16(0)
        hi = I16(0)
        for mm in range(8):
            m = 16 * c + 8 * hf + mm
            v = half_word(qs, t, b, m, r)
            e = o + 64 * c + (2 * m) % 32
            lo = I16(lo + _bits(v, 0, 15) * xq[i, e] + _bits(v, 8, 15) * xq[i, e + 1])
            hi = I16(hi + _bits(v, 4, 15) * xq[i, e + 32] + _bits(v, 12, 15) * xq[i, e + 33])
        part[4 * c + hf, r] = lo
        part[4 * c + 2 + hf, r] = hi


@njit(cache=True, inline="always")
def _sum_q5k_quarter(qs, qh, t, b, xq, i, o, c, qt, part):
    """Groups of 8: part[8c + qt] (sub-block 2c, l in 8qt..8qt+7), part[8c + 4 + qt] (2c + 1).
    qh byte l holds the fifth bit of elements 64c + l (bit 2c) and 64c + 32 + l (bit 2c + 1)."""
    for r in range(R):
        lo = I16(0)
        hi = I16(0)
        for mm in range(4):
            m = 16 * c + 4 * qt + mm
            v = half_word(qs, t, b, m, r)
            hb = half_word(qh, t, b, m % 16, r)
            e = o + 64 * c + (2 * m) % 32
            lo = I16(lo + I16(_bits(v, 0, 15) | _bit_to(hb, 2 * c, 4)) * xq[i, e]
                     + I16(_bits(v, 8, 15) | _bit_to(hb, 8 + 2 * c, 4)) * xq[i, e + 1])
            hi = I16(hi + I16(_bits(v, 4, 15) | _bit_to(hb, 2 * c + 1, 4)) * xq[i, e + 32]
                     + I16(_bits(v, 12, 15) | _bit_to(hb, 9 + 2 * c, 4)) * xq[i, e + 33])
        part[8 * c + qt, r] = lo
        part[8 * c + 4 + qt, r] = hi


@njit(cache=True, inline="always")
def _sum_q5k_chunk(qs, qh, t, b, xq, i, o, c, part):
    for qt in range(4):
        _sum_q5k_quarter(qs, qh, t, b, xq, i, o, c, qt, part)


# ------------------------------------------------------------------------------------- Q6_K phase 1
# ql word m (0..63): half h = m // 32, byte position p = 2m % 64. Its low nibbles are elements
# 128h + 32s + l, its high nibbles 128h + 32(s + 2) + l, with s = p // 32 and l = p % 32. The two
# high bits of each come from qh byte 32h + l at shifts 2s and 2(s + 2): qh word 16h + l // 2.

@njit(cache=True, inline="always")
def _q6_value(v, hw, byte, nib, s):
    low = _bits(v, 8 * byte + 4 * nib, 15)
    high = _bits(hw, 8 * byte + 2 * (s + 2 * nib), 3) << I16(4)
    return I16((low | high) - I16(32))


@njit(cache=True, inline="always")
def _sum_q6_quarter(ql, qh, t, b, xq, i, o, h, s, qt, part):
    """Groups of 8 (signed 6-bit quants): elements 128h + 32s + 8qt .. +7 into part[16h + 4s + qt],
    and the same + 64 into part[16h + 4(s + 2) + qt]."""
    for r in range(R):
        lo = I16(0)
        hi = I16(0)
        for mm in range(4):
            m = 32 * h + 16 * s + 4 * qt + mm
            v = half_word(ql, t, b, m, r)
            l = (2 * m) % 32
            hw = half_word(qh, t, b, 16 * h + l // 2, r)
            e = o + 128 * h + 32 * s + l
            lo = I16(lo + _q6_value(v, hw, 0, 0, s) * xq[i, e] + _q6_value(v, hw, 1, 0, s) * xq[i, e + 1])
            hi = I16(hi + _q6_value(v, hw, 0, 1, s) * xq[i, e + 64] + _q6_value(v, hw, 1, 1, s) * xq[i, e + 65])
        part[16 * h + 4 * s + qt, r] = lo
        part[16 * h + 4 * (s + 2) + qt, r] = hi


@njit(cache=True, inline="always")
def _sum_q6_hs(ql, qh, t, b, xq, i, o, h, s, part):
    for qt in range(4):
        _sum_q6_quarter(ql, qh, t, b, xq, i, o, h, s, qt, part)


@njit(cache=True, inline="always")
def _sum_q6_block(w, t, b, xq, i, o, part):
    # literal s: the high-bit shifts depend on it and must be constants
    ql, qh = w[0], w[1]
    prefetch_slice(w, t, b, NEXT_BLOCK, 0, 4)
    _sum_q6_hs(ql, qh, t, b, xq, i, o, 0, 0, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 1, 4)
    _sum_q6_hs(ql, qh, t, b, xq, i, o, 0, 1, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 2, 4)
    _sum_q6_hs(ql, qh, t, b, xq, i, o, 1, 0, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 3, 4)
    _sum_q6_hs(ql, qh, t, b, xq, i, o, 1, 1, part)


# ------------------------------------------------------------------------------------------ phase 2
# numba adds and multiplies int32s in int64; each sum is cast back to I32 so LLVM keeps 32-bit lanes
# (every sum fits: at most 16 groups of |scale| <= 127 times |group sum| < 2**16)
@njit(cache=True, inline="always")
def _acc_q2_k(acc, part, sc, d, dmin, dy, bsums, i, b):
    """ggml: sumf += dall * sum(scale_g * sum_g) - dmin * sum(min_g * bsum_g), scale/min nibbles."""
    for r in range(R):
        isum = I32(0)
        summ = I32(0)
        for g in range(16):
            s = I32(sc[g, r])
            isum = I32(isum + (s & 15) * I32(part[g, r]))
            summ = I32(summ + (s >> 4) * bsums[i, 16 * b + g])
        acc[r] += (dy * f16_bits_to_f32(d[r])) * F32(isum) - (dy * f16_bits_to_f32(dmin[r])) * F32(summ)


@njit(cache=True, inline="always")
def _acc_q3_k(acc, part, sc, d, dy, bsums, i, b):
    """sum over 16-groups of scale * (sum(u * x) - 4 * bsum): u = q + 4 is what phase 1 summed."""
    for r in range(R):
        isum = I32(0)
        for g in range(16):
            isum = I32(isum + I32(sc[g, r]) * (I32(part[g, r]) - 4 * bsums[i, 16 * b + g]))
        acc[r] += (dy * f16_bits_to_f32(d[r])) * F32(isum)


@njit(cache=True, inline="always")
def _acc_k4(acc, part, per_sub, sc, mn, d, dmin, dy, bsums, i, b):
    """Q4_K / Q5_K: ``per_sub`` consecutive partial groups per 32-element sub-block (2 or 4; 1 the quads');
    0: block_quads folded the scales in, sub-blocks 2c and 2c + 1 in slot 2c (_fold_scales)."""
    for r in range(R):
        isum = I32(0)
        summ = I32(0)
        for sb in range(8):
            if per_sub == 0:
                if sb % 2 == 0:
                    isum = I32(isum + I32(part[sb, r]))
            else:
                s = I32(0)
                for p in range(per_sub):
                    s = I32(s + I32(part[per_sub * sb + p, r]))
                isum = I32(isum + I32(sc[sb, r]) * s)
            summ = I32(summ + I32(mn[sb, r]) * (bsums[i, 16 * b + 2 * sb] + bsums[i, 16 * b + 2 * sb + 1]))
        acc[r] += (dy * f16_bits_to_f32(d[r])) * F32(isum) - (dy * f16_bits_to_f32(dmin[r])) * F32(summ)


@njit(cache=True, inline="always")
def _acc_q6(acc, part, per_scale, w, t, b, dx, i):     # w: ql, qh, sc, d
    """``per_scale`` consecutive partial sums per 16-element scale group: 2 (the int16 groups of 8), 1 (the quads');
    0: block_quads folded the scales in, groups g and g + 1 in slot g for even g (_fold_scales)."""
    sc, d, dy = w[2][t, b], w[3][t, b], dx[i, b]
    for r in range(R):
        isum = I32(0)
        for g in range(16):
            if per_scale == 0:
                if g % 2 == 0:
                    isum += I32(part[g, r])
            else:
                s = I32(0)
                for p in range(per_scale):
                    s = I32(s + I32(part[per_scale * g + p, r]))
                isum += I32(sc[g, r]) * s
        acc[r] += (dy * d[r]) * F32(isum)


@njit(cache=True, inline="always")
def _acc_q6_k(acc, part, w, t, b, dx, xe, i):
    _acc_q6(acc, part, 2, w, t, b, dx, i)


@njit(cache=True, inline="always")
def _acc_q6_k_quads(acc, part, w, t, b, dx, xe, i):   # the quads' sums, one a scale group (quad_groups=16)
    _acc_q6(acc, part, 1, w, t, b, dx, i)


@njit(cache=True, inline="always")
def _acc_q6_k_block_quads(acc, part, w, t, b, dx, xe, i):   # block_quads' sums, the scales folded in
    _acc_q6(acc, part, 0, w, t, b, dx, i)


# -------------------------------------------------------------------------------- batched decoding
# A super-block of a row tile is decoded once into w (256, R) int16 and multiplied into every token.
# Decoded values: Q2_K 0..3, Q3_K 0..7 (offset 4 left to bsums; decoded by _decode_q4_k),
# Q4_K 0..15, Q5_K 0..31, Q6_K -32..31.

@njit(cache=True, inline="always")
def _decode_q2_k(qs, t, b, w):
    for m in range(32):
        e = 128 * (m // 16) + (2 * m) % 32
        for r in range(R):
            v = I16(qs[t, b, m, r])
            for s in range(4):
                w[e + 32 * s, r] = _bits(v, 2 * s, 3)
                w[e + 32 * s + 1, r] = _bits(v, 8 + 2 * s, 3)


@njit(cache=True, inline="always")
def _decode_q4_k(qs, t, b, w):
    for m in range(32):
        e = 64 * (m // 8) + 4 * (m % 8)
        for r in range(R):
            v = U32(qs[t, b, m, r])
            for h in range(4):
                w[e + h, r] = I16((v >> U32(8 * h)) & U32(15))
                w[e + 32 + h, r] = I16((v >> U32(8 * h + 4)) & U32(15))


@njit(cache=True, inline="always")
def _decode_q5_k_chunk(qs, qh, t, b, c, w):
    for m in range(16 * c, 16 * c + 16):
        e = 64 * c + (2 * m) % 32
        for r in range(R):
            v = half_word(qs, t, b, m, r)
            hb = half_word(qh, t, b, m % 16, r)
            w[e, r] = _bits(v, 0, 15) | _bit_to(hb, 2 * c, 4)
            w[e + 1, r] = _bits(v, 8, 15) | _bit_to(hb, 8 + 2 * c, 4)
            w[e + 32, r] = _bits(v, 4, 15) | _bit_to(hb, 2 * c + 1, 4)
            w[e + 33, r] = _bits(v, 12, 15) | _bit_to(hb, 9 + 2 * c, 4)


@njit(cache=True, inline="always")
def _decode_q5_k(qs, qh, t, b, w):
    _decode_q5_k_chunk(qs, qh, t, b, 0, w)
    _decode_q5_k_chunk(qs, qh, t, b, 1, w)
    _decode_q5_k_chunk(qs, qh, t, b, 2, w)
    _decode_q5_k_chunk(qs, qh, t, b, 3, w)


@njit(cache=True, inline="always")
def _decode_q6_k_hs(ql, qh, t, b, h, s, w):
    for m in range(32 * h + 16 * s, 32 * h + 16 * s + 16):
        l = (2 * m) % 32
        e = 128 * h + 32 * s + l
        for r in range(R):
            v = half_word(ql, t, b, m, r)
            hw = half_word(qh, t, b, 16 * h + l // 2, r)
            w[e, r] = _q6_value(v, hw, 0, 0, s)
            w[e + 1, r] = _q6_value(v, hw, 1, 0, s)
            w[e + 64, r] = _q6_value(v, hw, 0, 1, s)
            w[e + 65, r] = _q6_value(v, hw, 1, 1, s)


@njit(cache=True, inline="always")
def _decode_q6_k(w, t, b, wd):
    ql, qh = w[0], w[1]
    _decode_q6_k_hs(ql, qh, t, b, 0, 0, wd)
    _decode_q6_k_hs(ql, qh, t, b, 0, 1, wd)
    _decode_q6_k_hs(ql, qh, t, b, 1, 0, wd)
    _decode_q6_k_hs(ql, qh, t, b, 1, 1, wd)


# ----------------------------------------------------------------------------- byte-quad decoding
# Quad j: elements 4j .. 4j+3 of a row as the bytes of one int32 lane (see cpu_pieces). Word pair 2p, 2p+1
# holds four consecutive quant bytes of a row: the elements _decode_* gives words 2p and 2p+1, in order.

@njit(cache=True, inline="always")
def _quads_q2_k(qs, t, b, wq):
    for p in range(16):
        j = 32 * (p // 8) + p % 8          # elements 128 (p // 8) + 4 (p % 8) + 32 s
        for r in range(R):
            v = word_pair(qs, t, b, 2 * p, r)
            for s in range(4):
                wq[j + 8 * s, r] = I32((v >> U32(2 * s)) & U32(0x03030303))


@njit(cache=True, inline="always")
def _quads_q4_k(qs, t, b, wq):
    for p in range(32):
        j = 16 * (p // 8) + p % 8          # low nibbles: elements 64 (p // 8) + 4 (p % 8); high ones 32 on
        for r in range(R):
            v = U32(qs[t, b, p, r])
            wq[j, r] = I32(v & U32(0x0F0F0F0F))
            wq[j + 8, r] = I32((v >> U32(4)) & U32(0x0F0F0F0F))


@njit(cache=True, inline="always")
def _quads_q5_k_chunk(qs, qh, t, b, c, wq):
    for p in range(8 * c, 8 * c + 8):
        j = 16 * c + p % 8
        for r in range(R):
            v = U32(qs[t, b, p, r])
            hq = U32(qh[t, b, p % 8, r])      # fifth bits: 2c (low nibble), 2c + 1 (high)
            wq[j, r] = I32((v & U32(0x0F0F0F0F)) | (((hq >> U32(2 * c)) & U32(0x01010101)) << U32(4)))
            wq[j + 8, r] = I32(((v >> U32(4)) & U32(0x0F0F0F0F)) | (((hq >> U32(2 * c + 1)) & U32(0x01010101)) << U32(4)))


@njit(cache=True, inline="always")
def _q5_k_quads(w, t, b, wq):
    _quads_q5_k_chunk(w[0], w[1], t, b, 0, wq)
    _quads_q5_k_chunk(w[0], w[1], t, b, 1, wq)
    _quads_q5_k_chunk(w[0], w[1], t, b, 2, wq)
    _quads_q5_k_chunk(w[0], w[1], t, b, 3, wq)


@njit(cache=True, inline="always")
def _quads_q6_k_hs(ql, qh, t, b, h, s, wq):
    """Elements 128h + 32s + 4p .. +3 (low nibbles) and the same + 64 (high ones) as q + 32 (0..63)."""
    for p in range(8):
        j = 32 * h + 8 * s + p
        for r in range(R):
            v = U32(ql[t, b, 16 * h + 8 * s + p, r])
            hq = U32(qh[t, b, 8 * h + p, r])             # two bits per element: 2s (+4 high)
            wq[j, r] = I32((v & U32(0x0F0F0F0F)) | (((hq >> U32(2 * s)) & U32(0x03030303)) << U32(4)))
            wq[j + 16, r] = I32(((v >> U32(4)) & U32(0x0F0F0F0F)) | (((hq >> U32(2 * s + 4)) & U32(0x03030303)) << U32(4)))


@njit(cache=True, inline="always")
def _q6_k_quads(w, t, b, wq):
    _quads_q6_k_hs(w[0], w[1], t, b, 0, 0, wq)
    _quads_q6_k_hs(w[0], w[1], t, b, 0, 1, wq)
    _quads_q6_k_hs(w[0], w[1], t, b, 1, 0, wq)
    _quads_q6_k_hs(w[0], w[1], t, b, 1, 1, wq)


@njit(cache=True, inline="always")
def _q2_k_quads(w, t, b, wq):
    _quads_q2_k(w[0], t, b, wq)


@njit(cache=True, inline="always")
def _q4_k_quads(w, t, b, wq):     # also Q3_K's (its quants repacked as Q4_K nibbles)
    _quads_q4_k(w[0], t, b, wq)


# ------------------------------------------------------------------------------------ the pieces
# w is what the type's pack returned; dx the Q8_K scales, xe its bsums (sums of 16 activations).

@njit(cache=True, inline="always")
def _q2_k_sums(w, t, b, xq, i, o, part):
    # literal q: in a loop with the prefetch in it LLVM kept q a variable, and the segment's shifts with it
    # (5x slower); a quarter of the next block asked for before each segment
    prefetch_slice(w, t, b, NEXT_BLOCK, 0, 4)
    _sum_q2_segment(w[0], t, b, xq, i, o, 0, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 1, 4)
    _sum_q2_segment(w[0], t, b, xq, i, o, 1, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 2, 4)
    _sum_q2_segment(w[0], t, b, xq, i, o, 2, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 3, 4)
    _sum_q2_segment(w[0], t, b, xq, i, o, 3, part)


@njit(cache=True, inline="always")
def _q4_k_sums(w, t, b, xq, i, o, part):     # also Q3_K's, whose quants are repacked as Q4_K nibbles
    for c in range(4):
        prefetch_slice(w, t, b, NEXT_BLOCK, c, 4)
        _sum_q4k_half(w[0], t, b, xq, i, o, c, 0, part)
        _sum_q4k_half(w[0], t, b, xq, i, o, c, 1, part)


@njit(cache=True, inline="always")
def _q5_k_sums(w, t, b, xq, i, o, part):
    # literal c (the fifth-bit shifts), and a quarter of the next block asked for before each chunk
    qs, qh = w[0], w[1]
    prefetch_slice(w, t, b, NEXT_BLOCK, 0, 4)
    _sum_q5k_chunk(qs, qh, t, b, xq, i, o, 0, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 1, 4)
    _sum_q5k_chunk(qs, qh, t, b, xq, i, o, 1, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 2, 4)
    _sum_q5k_chunk(qs, qh, t, b, xq, i, o, 2, part)
    prefetch_slice(w, t, b, NEXT_BLOCK, 3, 4)
    _sum_q5k_chunk(qs, qh, t, b, xq, i, o, 3, part)


@njit(cache=True, inline="always")
def _fold_scales(part, sc, ntok, g0, n):
    """part[u, g0] = sum of sc[g] * part[u, g] over the n groups from g0 (tokens u < ntok), in int32 as the
    accumulate would: a chunk's scales applied right after its sums (BlockPieces.accumulate_block_quads).
    Spread over the block's chunks, this work sits between loops that load the weight and ask for the next
    block's lines; left to the block's end it was a stretch with neither, which a one-token Q4_K product
    from memory paid for with ~20% of its time (in cache 2%; docs/performance.md, "Thirteenth session")."""
    for u in range(ntok):
        for r in range(R):
            s = I32(0)
            for g in range(g0, g0 + n):
                s = I32(s + I32(sc[g, r]) * part[u, g, r])
            part[u, g0, r] = s


@njit(cache=True, inline="always")
def _q4_k_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q4_K's sums straight from its words, one a sub-block (quad_groups=8): chunk c's low nibbles are
    sub-block 2c, its high ones 2c + 1, their scaled sum left in slot 2c (_fold_scales); a quarter of the
    next block asked for before each chunk."""
    qs, sc = w[0], w[1][t, b]
    prefetch_slice(w[1:], t, b, NEXT_BLOCK, 0, 1)
    for c in range(4):
        word_quad_sums(qs, qs, (t, b, 8 * c, 8, 0, 0, 0), x8, i, ntok,
                       (o + 64 * c, o + 64 * c + 32, 2 * c, 2 * c + 1, 0, 0), part, R, 0, xs, 0, NEXT_BLOCK)
        _fold_scales(part, sc, ntok, 2 * c, 2)


@njit(cache=True, inline="always")
def _q3_k_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q3_K's sums (its quants repacked as Q4_K's nibbles), one a 16-element scale group (its 16 groups)."""
    qs = w[0]
    prefetch_slice(w[1:], t, b, NEXT_BLOCK, 0, 1)
    for c in range(4):
        for g4 in range(2):
            word_quad_sums(qs, qs, (t, b, 8 * c + 4 * g4, 4, 0, 0, 0), x8, i, ntok,
                           (o + 64 * c + 16 * g4, o + 64 * c + 32 + 16 * g4, 4 * c + g4, 4 * c + 2 + g4, 0, 0),
                           part, R, 0, xs, 0, NEXT_BLOCK)


# Q5_K's qs are Q4_K's words, its qh 8 words more: qh word j (bytes 4j ..) holds at bit 2c of each byte the fifth
# bits of chunk c's low-nibble quad (elements 64c + 4j ..) and at bit 2c + 1 those of its high-nibble one (+ 32).
# A group is a sub-block (8 words) where the quads add in int32, 8 elements (2 words) on AVX2 (half a 32-element
# group of 5-bit products would overflow int16).
Q5K_GROUP_WORDS = 8 if quads_add_in_int32() else 2


@njit(cache=True, inline="always")
def _q5_k_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q5_K's sums straight from its words, the fifth bits or'ed in from qh."""
    qs, qh = w[0], w[1]
    gsize = 4 * Q5K_GROUP_WORDS
    prefetch_slice(w[2:], t, b, NEXT_BLOCK, 0, 1)
    for c in range(4):
        for gi in range(8 // Q5K_GROUP_WORDS):
            e = 64 * c + gsize * gi
            word_quad_sums(qs, qh, (t, b, 8 * c + Q5K_GROUP_WORDS * gi, Q5K_GROUP_WORDS, Q5K_GROUP_WORDS * gi,
                                    2 * c, 2 * c + 1), x8, i, ntok,
                           (o + e, o + e + 32, e // gsize, (e + 32) // gsize, 0, 0), part, R, 1, xs, 0, NEXT_BLOCK)
        if Q5K_GROUP_WORDS == 8:      # one sum a sub-block (int32 quads): fold as Q4_K does; AVX2 keeps its groups
            _fold_scales(part, w[2][t, b], ntok, 2 * c, 2)


# Q6_K's ql and qh are 32-bit words too: ql word 16h + 8s + j holds bytes 64h + 32s + 4j .., whose low nibbles
# are elements 128h + 32s + 4j .. and high ones the same + 64; their two high bits are at shifts 2s and 2s + 4 of
# qh word 8h + (j % 8) (byte 32h + 4j ..). A group of the quads is a scale's 16 elements (4 words) where they
# add in int32, 8 (2 words) on AVX2, whose int16 pair sums would overflow past half of 8 x 63 x 128.
Q6_GROUP_WORDS = 4 if quads_add_in_int32() else 2


@njit(cache=True, inline="always")
def _q6_k_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q6_K's sums of (q + 32) x straight from its words, the bias 32 taken out through xs."""
    ql, qh = w[0], w[1]
    gsize = 4 * Q6_GROUP_WORDS
    prefetch_slice(w[2:], t, b, NEXT_BLOCK, 0, 1)
    for h in range(2):
        for s in range(2):
            for gi in range(8 // Q6_GROUP_WORDS):
                e = 128 * h + 32 * s + gsize * gi
                g_lo, g_hi = e // gsize, (e + 64) // gsize
                word_quad_sums(ql, qh, (t, b, 16 * h + 8 * s + Q6_GROUP_WORDS * gi, Q6_GROUP_WORDS,
                                        8 * h + Q6_GROUP_WORDS * gi, 2 * s, 2 * s + 4), x8, i, ntok,
                               (o + e, o + e + 64, g_lo, g_hi, b * (QK // gsize) + g_lo, b * (QK // gsize) + g_hi),
                               part, R, 2, xs, 32, NEXT_BLOCK)
            if Q6_GROUP_WORDS == 4:   # one sum a scale (int32 quads): groups 8h + 2s, +1 and + 4, + 5
                _fold_scales(part, w[2][t, b], ntok, 8 * h + 2 * s, 2)
                _fold_scales(part, w[2][t, b], ntok, 8 * h + 2 * s + 4, 2)


@njit(cache=True, inline="always")
def _q2_k_dec(w, t, b, wd):
    _decode_q2_k(w[0], t, b, wd)


@njit(cache=True, inline="always")
def _q4_k_dec(w, t, b, wd):
    _decode_q4_k(w[0], t, b, wd)


@njit(cache=True, inline="always")
def _q5_k_dec(w, t, b, wd):
    _decode_q5_k(w[0], w[1], t, b, wd)


@njit(cache=True, inline="always")
def _q2_k_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, sc, d, dmin
    _acc_q2_k(acc, part, w[1][t, b], w[2][t, b], w[3][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q3_k_acc(acc, part, w, t, b, dx, xe, i):      # w: qs (as nibbles), sc, d
    _acc_q3_k(acc, part, w[1][t, b], w[2][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q4_k_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, sc, mn, d, dmin
    _acc_k4(acc, part, 2, w[1][t, b], w[2][t, b], w[3][t, b], w[4][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q5_k_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, qh, sc, mn, d, dmin
    _acc_k4(acc, part, 4, w[2][t, b], w[3][t, b], w[4][t, b], w[5][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q4_k_quads_acc(acc, part, w, t, b, dx, xe, i):   # the quads' sums, one a sub-block (quad_groups=8)
    _acc_k4(acc, part, 1, w[1][t, b], w[2][t, b], w[3][t, b], w[4][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q5_k_quads_acc(acc, part, w, t, b, dx, xe, i):   # the quads' sums, one a sub-block (quad_groups=8)
    _acc_k4(acc, part, 1, w[2][t, b], w[3][t, b], w[4][t, b], w[5][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q4_k_block_acc(acc, part, w, t, b, dx, xe, i):   # block_quads' sums, the scales folded in
    _acc_k4(acc, part, 0, w[1][t, b], w[2][t, b], w[3][t, b], w[4][t, b], dx[i, b], xe, i, b)


@njit(cache=True, inline="always")
def _q5_k_block_acc(acc, part, w, t, b, dx, xe, i):   # block_quads' sums, the scales folded in
    _acc_k4(acc, part, 0, w[2][t, b], w[3][t, b], w[4][t, b], w[5][t, b], dx[i, b], xe, i, b)


PIECES = {
    # quads_from: where the quads kernel measured faster than the tile one (docs/performance.md, Zen 3)
    "Q2_K": BlockPieces(QK, 16, pack_q2_k, _q2_k_sums, _q2_k_dec, _q2_k_acc, _q2_k_quads, quads_from=2),
    "Q3_K": BlockPieces(QK, 16, pack_q3_k, _q4_k_sums, _q4_k_dec, _q3_k_acc, _q4_k_quads, quads_from=2,
                        block_quads=_q3_k_block_quads),
    "Q4_K": BlockPieces(QK, 16, pack_q4_k, _q4_k_sums, _q4_k_dec, _q4_k_acc, _q4_k_quads, quads_from=2,
                        quad_groups=8, accumulate_quads=_q4_k_quads_acc, block_quads=_q4_k_block_quads,
                        accumulate_block_quads=_q4_k_block_acc),
    "Q5_K": BlockPieces(QK, 32, pack_q5_k, _q5_k_sums, _q5_k_dec, _q5_k_acc, _q5_k_quads, quads_from=3,
                        quad_groups=8, accumulate_quads=_q5_k_quads_acc, quad_groups_int32=True,
                        block_quads=_q5_k_block_quads, accumulate_block_quads=_q5_k_block_acc),
    "Q6_K": BlockPieces(QK, 32, pack_q6_k, _sum_q6_block, _decode_q6_k, _acc_q6_k, _q6_k_quads, quad_bias=32,
                        quad_groups=16, accumulate_quads=_acc_q6_k_quads, quad_groups_int32=True,
                        block_quads=_q6_k_block_quads, accumulate_block_quads=_acc_q6_k_block_quads),
}
