"""Matmul pieces of the 32-element block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (activations Q8_0 / Q8_1).

Each type's pieces (``PIECES``, see ``cpu_pieces``) work on the row-tiled layout of ``qmm.layout``
and split a block's dot product in two loops, because LLVM sizes its vectors after the widest type
in a loop:

* an integer loop that only touches 8/16-bit values: for each group of products small enough to
  fit int16 (16 products of a 4-bit quant and an int8 activation: |sum| <= 16*15*127 < 2**15),
  the sum across TILE rows in int16 lanes (32 per 512-bit vector, see ``qmm.int16.wide_vectors``);
* a loop that widens those partial sums to int32, applies the block scales and accumulates in f32.

The integer sums are exactly the ones ggml's ``vec_dot`` forms; only the order of the float
accumulation differs. Offsets of unsigned encodings (Q4_0's -8, Q5_0's -16) come out through the
activation block sums: sum((q - 8) * x) = sum(q * x) - 8 * sum(x).

Quant bytes are kept as little-endian 32-bit words, four bytes of one row per lane (Q5's fifth bits as one
32-bit mask a block): products of up to 64 tokens take the byte quads straight from those words
(``block_quads``, ``qmm.quads.word_quad_sums``: nibbles masked, fifth bits spread, Q8_0's sign bits flipped,
in registers), no decoded block in between. The int16 one-pass sums read each word's 16-bit halves
(``half_word``: a 16-row load then needs no byte-to-word widening, only shifts and masks); they run where
the quads are not exact (Q8_0 without VNNI) or a test asks for them.

The j loops stay short (8 or 16 steps) so LLVM unrolls them completely and vectorizes the row loop
around them; with a longer body the j loop stays rolled and nothing is vectorized. Helpers are
inlined into the skeleton (``inline="always"``): compiled alone, LLVM vectorizes them worse.
The skeleton (``qmm.template``) runs the one-pass sums for a few tokens and ``decode`` for more.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.products.qmm.int16 import bit_to, field, half_word, sext8
from ggflow.backends_builtin.cpu.products.qmm.floats import f16_bits_to_f32
from ggflow.backends_builtin.cpu.products.qmm.layout import check_tile, tile_rows
from ggflow.backends_builtin.cpu.products.qmm.quads import BIT_MASK, SIGNED_BYTES, word_quad_sums
from ggflow.plugins.cpu_pieces import BlockPieces

F32 = np.float32
I16 = np.int16
I32 = np.int32
U32 = np.uint32
R = 64     # rows per tile, a compile-time constant of every piece here (see qmm.layout.TILE)
check_tile(R, __name__)


# ---------------------------------------------------------------------------------------------- packing
def _nibble_words(blocks: np.ndarray, start: int) -> np.ndarray:
    """The 16 nibble bytes of each block as 4 little-endian 32-bit words (int32), row-tiled: byte quads in place
    (``qmm.quads.word_quad_sums``)."""
    return tile_rows(np.ascontiguousarray(blocks[:, :, start:start + 16]).view(np.int32))


def _high_bit_mask(blocks: np.ndarray, start: int) -> np.ndarray:
    """The 32 fifth bits (qh) of each Q5 block as one 32-bit mask (bit e: element e), row-tiled (tiles, nb, 1, TILE)."""
    return tile_rows(np.ascontiguousarray(blocks[:, :, start:start + 4]).view(np.int32))


def _f16_words(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at byte ``offset`` of each block, kept as its 16 bits (the kernels widen it with vcvtph2ps):
    the packed weight is then no bigger than the file's blocks."""
    return tile_rows(np.ascontiguousarray(blocks[..., offset:offset + 2]).view(np.uint16)[..., 0])


def pack_q4_0(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 18)
    return _nibble_words(blocks, 2), _f16_words(blocks, 0)


def pack_q4_1(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 20)
    return _nibble_words(blocks, 4), _f16_words(blocks, 0), _f16_words(blocks, 2)


def pack_q5_0(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 22)
    return _nibble_words(blocks, 6), _high_bit_mask(blocks, 2), _f16_words(blocks, 0)


def pack_q5_1(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 24)
    return (_nibble_words(blocks, 8), _high_bit_mask(blocks, 4), _f16_words(blocks, 0),
            _f16_words(blocks, 2))


def pack_q8_0(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 34)
    qs = tile_rows(np.ascontiguousarray(blocks[:, :, 2:]).view(np.int32))     # 8 words: byte quads in place
    return qs, _f16_words(blocks, 0)


# --------------------------------------------------------------------------------- nibble decoding
# 16-bit word m of a 4-bit block (half_word) holds bytes 2m, 2m+1: elements 2m, 2m+1 in its low nibbles,
# 2m+16, 2m+17 in its high ones (ggml puts element j in the low nibble of byte j and j+16 in its high nibble);
# 32-bit word m4 holds bytes 4m4 .. 4m4+3, the quads of elements 4m4 .. (low nibbles) and 4m4+16 .. (high).

@njit(cache=True, inline="always")
def _sum_u4_block(qs, t, b, xq, i, o, part):
    """part[0|1, :] = sums over elements 0..15 | 16..31 of the nibble times the activation."""
    for r in range(R):
        lo = I16(0)
        hi = I16(0)
        for m in range(8):
            v = half_word(qs, t, b, m, r)
            lo = I16(lo + field(v, 0, 15) * xq[i, o + 2 * m] + field(v, 8, 15) * xq[i, o + 2 * m + 1])
            hi = I16(hi + field(v, 4, 15) * xq[i, o + 16 + 2 * m] + field(v, 12, 15) * xq[i, o + 17 + 2 * m])
        part[0, r] = lo
        part[1, r] = hi


@njit(cache=True, inline="always")
def _sum_u5_half(qs, qh, t, b, xq, i, o, m0, part, p0):
    """Sums of 8-product groups (5-bit quants: 8 * 31 * 127 < 2**15) for words m0..m0+3:
    part[p0] covers elements 2*m0 .. 2*m0+7, part[p0+1] the same elements + 16."""
    for r in range(R):
        lo = I16(0)
        hi = I16(0)
        hl = half_word(qh, t, b, 0, r)
        hh = half_word(qh, t, b, 1, r)
        for mm in range(4):
            m = m0 + mm
            v = half_word(qs, t, b, m, r)
            lo = I16(lo + I16(field(v, 0, 15) | bit_to(hl, 2 * m, 4)) * xq[i, o + 2 * m]
                     + I16(field(v, 8, 15) | bit_to(hl, 2 * m + 1, 4)) * xq[i, o + 2 * m + 1])
            hi = I16(hi + I16(field(v, 4, 15) | bit_to(hh, 2 * m, 4)) * xq[i, o + 16 + 2 * m]
                     + I16(field(v, 12, 15) | bit_to(hh, 2 * m + 1, 4)) * xq[i, o + 17 + 2 * m])
        part[p0, r] = lo
        part[p0 + 1, r] = hi


@njit(cache=True, inline="always")
def _sum_i8_block(qs, t, b, xq, i, o, part):
    """part[m, :] = w[2m] * x[2m] + w[2m+1] * x[2m+1]: int8 times int8 only fits int16 in pairs."""
    for m in range(16):       # m outside: one store stream per vectorized loop, no alias-check blowup
        for r in range(R):
            v = half_word(qs, t, b, m, r)
            part[m, r] = I16(sext8(v, 0) * xq[i, o + 2 * m] + sext8(v, 1) * xq[i, o + 2 * m + 1])


# -------------------------------------------------------------------------------- batched decoding
# Decode a block of a row tile once into w (32, R) int16, then multiply it into every token.

@njit(cache=True, inline="always")
def _decode_u4(qs, t, b, w):
    for m4 in range(4):
        for r in range(R):
            v = U32(qs[t, b, m4, r])
            for h in range(4):
                w[4 * m4 + h, r] = I16((v >> U32(8 * h)) & U32(15))
                w[16 + 4 * m4 + h, r] = I16((v >> U32(8 * h + 4)) & U32(15))


@njit(cache=True, inline="always")
def _decode_u5(qs, qh, t, b, w):
    _decode_u4(qs, t, b, w)
    for j in range(16):
        for r in range(R):
            w[j, r] |= bit_to(half_word(qh, t, b, 0, r), j, 4)
            w[16 + j, r] |= bit_to(half_word(qh, t, b, 1, r), j, 4)


@njit(cache=True, inline="always")
def _decode_i8(qs, t, b, w):
    for m in range(16):
        for r in range(R):
            v = half_word(qs, t, b, m, r)
            w[2 * m, r] = sext8(v, 0)
            w[2 * m + 1, r] = sext8(v, 1)

# ----------------------------------------------------------------------------- byte-quad decoding
# Quad j of a block: elements 4j .. 4j+3 of a row as the bytes of one int32 lane (for vpdpbusd). Words
# 2m4 and 2m4+1 of a 4-bit block are its bytes 4m4 .. 4m4+3: low nibbles elements 4m4.., high ones +16.

NIBBLES = U32(0x0F0F0F0F)
SIGN_BITS = U32(0x80808080)


@njit(cache=True, inline="always")
def _quads_u4(qs, t, b, wq):     # Q4_0 / Q4_1's 32-bit words
    for m4 in range(4):
        for r in range(R):
            v = U32(qs[t, b, m4, r])
            wq[m4, r] = I32(v & NIBBLES)
            wq[4 + m4, r] = I32((v >> U32(4)) & NIBBLES)


@njit(cache=True, inline="always")
def _quads_i8(qs, t, b, wq):
    """A Q8_0 block's signed bytes as unsigned ones, + 128 (the top bit flipped): quad_bias 128."""
    for j in range(8):
        for r in range(R):
            wq[j, r] = I32(U32(qs[t, b, j, r]) ^ SIGN_BITS)


@njit(cache=True, inline="always")
def _bits_to_bytes(x):
    """Bits 0..3 of x to bit 4 of bytes 0..3 (a Q5 block's fifth bits beside their nibbles)."""
    return ((x & U32(1)) | ((x & U32(2)) << U32(7)) | ((x & U32(4)) << U32(14)) | ((x & U32(8)) << U32(21))) << U32(4)


@njit(cache=True, inline="always")
def _quads_u5(qs, qh, t, b, wq):
    for m4 in range(4):
        for r in range(R):
            v = U32(qs[t, b, m4, r])
            h = U32(qh[t, b, 0, r])
            wq[m4, r] = I32((v & NIBBLES) | _bits_to_bytes(h >> U32(4 * m4)))
            wq[4 + m4, r] = I32(((v >> U32(4)) & NIBBLES) | _bits_to_bytes(h >> U32(16 + 4 * m4)))


# ------------------------------------------------------------------------------------ the pieces
# w is what the type's pack returned; dx, xe the Q8_0 / Q8_1 activation scales and block sums.

@njit(cache=True, inline="always")
def _isum(part, r, ngroups):
    # a literal group count at each call site: the g loop unrolls inside the vectorized row loop.
    # numba adds int32s in int64; the I32 casts here and at the call sites let LLVM keep 32-bit lanes
    s = I32(0)
    for g in range(ngroups):
        s = I32(s + I32(part[g, r]))
    return s


@njit(cache=True, inline="always")
def _acc_offset(acc, part, ngroups, dw, off, db):
    """Q4_0 / Q5_0 / Q8_0: acc += (isum - off) * d_w * d_x, off = the encoding's offset * sum(x)."""
    for r in range(R):
        acc[r] += F32(I32(_isum(part, r, ngroups) - off)) * (f16_bits_to_f32(dw[r]) * db)


@njit(cache=True, inline="always")
def _acc_min(acc, part, ngroups, dw, mw, db, sb):
    """Q4_1 / Q5_1 (ggml: sumf += d_w*d_x*sumi + m_w*s_x, s_x = f16(d_x * sum(x)))."""
    for r in range(R):
        acc[r] += F32(_isum(part, r, ngroups)) * (f16_bits_to_f32(dw[r]) * db) + f16_bits_to_f32(mw[r]) * sb


@njit(cache=True, inline="always")
def _q4_sums(w, t, b, xq, i, o, part):
    _sum_u4_block(w[0], t, b, xq, i, o, part)


@njit(cache=True, inline="always")
def _q5_sums(w, t, b, xq, i, o, part):
    _sum_u5_half(w[0], w[1], t, b, xq, i, o, 0, part, 0)
    _sum_u5_half(w[0], w[1], t, b, xq, i, o, 4, part, 2)


@njit(cache=True, inline="always")
def _q8_sums(w, t, b, xq, i, o, part):
    _sum_i8_block(w[0], t, b, xq, i, o, part)


@njit(cache=True, inline="always")
def _q4_decode(w, t, b, wd):
    _decode_u4(w[0], t, b, wd)


@njit(cache=True, inline="always")
def _q5_decode(w, t, b, wd):
    _decode_u5(w[0], w[1], t, b, wd)


@njit(cache=True, inline="always")
def _q8_decode(w, t, b, wd):
    _decode_i8(w[0], t, b, wd)


@njit(cache=True, inline="always")
def _q4_quads(w, t, b, wq):
    _quads_u4(w[0], t, b, wq)


@njit(cache=True, inline="always")
def _q4_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q4_0 / Q4_1's two group sums straight from their words: low nibbles elements 0..15, high 16..31."""
    qs = w[0]
    word_quad_sums(qs, qs, (t, b, 0, 4, 0, 0, 0), x8, i, ntok, (o, o + 16, 0, 1, 0, 0), part, R, 0, xs, 0, 0)


@njit(cache=True, inline="always")
def _q5_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q5_0 / Q5_1's four 8-element group sums straight from their words, the fifth bits spread from the mask."""
    qs, qh = w[0], w[1]
    for g in range(2):
        word_quad_sums(qs, qh, (t, b, 2 * g, 2, 0, 8 * g, 16 + 8 * g), x8, i, ntok,
                       (o + 8 * g, o + 16 + 8 * g, g, 2 + g, 0, 0), part, R, BIT_MASK, xs, 0, 0)


@njit(cache=True, inline="always")
def _q8_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Q8_0's one sum a block straight from its words, each byte + 128 (its sign bit flipped), 128 * sum(x) out."""
    qs = w[0]
    word_quad_sums(qs, qs, (t, b, 0, 8, 0, 0, 0), x8, i, ntok, (o, o, 0, 0, b, b), part, R, SIGNED_BYTES, xs, 128, 0)


@njit(cache=True, inline="always")
def _q5_quads(w, t, b, wq):
    _quads_u5(w[0], w[1], t, b, wq)


@njit(cache=True, inline="always")
def _q8_quads(w, t, b, wq):
    _quads_i8(w[0], t, b, wq)


@njit(cache=True, inline="always")
def _q8_0_quads_acc(acc, part, w, t, b, dx, xe, i):   # the quads' one sum a block (quad_groups=1)
    _acc_offset(acc, part, 1, w[1][t, b], 0, dx[i, b])


@njit(cache=True, inline="always")
def _q4_0_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, d
    _acc_offset(acc, part, 2, w[1][t, b], 8 * xe[i, b], dx[i, b])


@njit(cache=True, inline="always")
def _q4_1_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, d, m
    _acc_min(acc, part, 2, w[1][t, b], w[2][t, b], dx[i, b], xe[i, b])


@njit(cache=True, inline="always")
def _q5_0_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, qh, d
    _acc_offset(acc, part, 4, w[2][t, b], 16 * xe[i, b], dx[i, b])


@njit(cache=True, inline="always")
def _q5_1_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, qh, d, m
    _acc_min(acc, part, 4, w[2][t, b], w[3][t, b], dx[i, b], xe[i, b])


@njit(cache=True, inline="always")
def _q8_0_acc(acc, part, w, t, b, dx, xe, i):      # w: qs, d
    _acc_offset(acc, part, 16, w[1][t, b], 0, dx[i, b])


# A matvec streams these types' small blocks (1-2 KiB a tile) faster than the hardware prefetchers bring
# them: asking for the bytes 8 KiB ahead took a one-thread 5632 x 2048 matvec from memory from 19 to 29-35
# GB/s (Q4_0) and 21 to 30 GB/s (Q8_0) on a Zen 4 (2 and 4 KiB gave less; docs/performance.md). The
# K-quants' big blocks ask for theirs a quarter at a time instead (qmm.prefetch).
PREFETCH = 8192

PIECES = {
    # quads_from: from where the decoded quads measured faster than the tile kernel (docs/performance.md, Zen 3;
    # a Q5 quad costs shifts for its fifth bits and its groups of 8 twice the widening steps); up to
    # BLOCK_QUADS_MAX_TOKENS tokens every type here with block_quads takes those (qmm.template.batch_path)
    "Q4_0": BlockPieces(32, 2, pack_q4_0, _q4_sums, _q4_decode, _q4_0_acc, _q4_quads, quads_from=2,
                        block_quads=_q4_block_quads, prefetch_bytes=PREFETCH),
    "Q4_1": BlockPieces(32, 2, pack_q4_1, _q4_sums, _q4_decode, _q4_1_acc, _q4_quads, quads_from=2,
                        block_quads=_q4_block_quads, prefetch_bytes=PREFETCH),
    "Q5_0": BlockPieces(32, 4, pack_q5_0, _q5_sums, _q5_decode, _q5_0_acc, _q5_quads, quads_from=8,
                        block_quads=_q5_block_quads, prefetch_bytes=PREFETCH),
    "Q5_1": BlockPieces(32, 4, pack_q5_1, _q5_sums, _q5_decode, _q5_1_acc, _q5_quads, quads_from=8,
                        block_quads=_q5_block_quads, prefetch_bytes=PREFETCH),
    # Q8_0's quads hold whole signed bytes (bias 128): batch_path takes them only where that is exact
    # (VNNI), and there from one token: 12-20% faster than the int16 matvec (Sapphire Rapids), 2-3x batched
    "Q8_0": BlockPieces(32, 16, pack_q8_0, _q8_sums, _q8_decode, _q8_0_acc, _q8_quads, quad_bias=128,
                        quads_from=1, quad_groups=1, accumulate_quads=_q8_0_quads_acc, prefetch_bytes=PREFETCH,
                        block_quads=_q8_block_quads),
}
