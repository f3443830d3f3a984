"""Kernels for the 32-element block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (activations Q8_0 / Q8_1).

Every kernel works on the row-tiled layout of ``_qmm_layout`` and splits a block's dot product in two
loops, because LLVM sizes its vectors after the widest type in a loop:

* an integer loop that only touches 8/16-bit values: for each group of products small enough to
  fit int16 (16 products of a 4-bit quant and an int8 activation: |sum| <= 16*15*127 < 2**15),
  the sum across TILE rows in int16 lanes (32 per 512-bit vector, see ``_qmm_int16.wide_vectors``);
* a loop that widens those partial sums to int32, applies the block scales and accumulates in f32.

The integer sums are exactly the ones ggml's ``vec_dot`` forms; only the order of the float
accumulation differs. Offsets of unsigned encodings (Q4_0's -8, Q5_0's -16) come out through the
activation block sums: sum((q - 8) * x) = sum(q * x) - 8 * sum(x).

Quant bytes are read as little-endian uint16 words, two bytes of one row per lane: a 16-row load
then needs no byte-to-word widening (a shuffle-port instruction), only shifts and masks.

The j loops stay short (8 or 16 steps) so LLVM unrolls them completely and vectorizes the row loop
around them; with a longer body the j loop stays rolled and nothing is vectorized. Helpers are
inlined into the tile functions (``inline="always"``): compiled alone, LLVM vectorizes them worse.

Each type has a tile function, ``_tile_<type>(t, ...)``, a parallel driver ``mul_mat_<type>`` whose
prange body is that single call (numba's parfor passes over big bodies cost compile time), and a
serial driver for small products. Up to MATVEC_MAX_TOKENS tokens a tile decodes and multiplies in one
pass per token; more tokens decode each block of the tile once into int16 and reuse it for every token.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ggflow.backends_builtin.cpu._qmm_int16 import bit_to, field, sext8, wide_vectors
from ggflow.backends_builtin.cpu._qmm_layout import check_tile, f16_field, tile_rows

F32 = np.float32
I16 = np.int16
I32 = np.int32
R = 64     # rows per tile, a compile-time constant of every kernel here (see _qmm_layout.TILE)
check_tile(R, __name__)
MATVEC_MAX_TOKENS = 2   # up to this many tokens the one-pass matvec beats decoding into a buffer


# ---------------------------------------------------------------------------------------------- packing
def _nibble_words(blocks: np.ndarray, start: int) -> np.ndarray:
    """The 16 nibble bytes of each block as 8 little-endian uint16 words, row-tiled."""
    return tile_rows(np.ascontiguousarray(blocks[:, :, start:start + 16]).view(np.uint16))


def _high_bit_words(blocks: np.ndarray, start: int) -> np.ndarray:
    """The 32 fifth bits (qh) of each Q5 block as 2 uint16 words: elements 0..15, 16..31."""
    return tile_rows(np.ascontiguousarray(blocks[:, :, start:start + 4]).view(np.uint16))


def pack_q4_0(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 18)
    return _nibble_words(blocks, 2), tile_rows(f16_field(blocks, 0))


def pack_q4_1(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 20)
    return _nibble_words(blocks, 4), tile_rows(f16_field(blocks, 0)), tile_rows(f16_field(blocks, 2))


def pack_q5_0(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 22)
    return _nibble_words(blocks, 6), _high_bit_words(blocks, 2), tile_rows(f16_field(blocks, 0))


def pack_q5_1(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 24)
    return (_nibble_words(blocks, 8), _high_bit_words(blocks, 4), tile_rows(f16_field(blocks, 0)),
            tile_rows(f16_field(blocks, 2)))


def pack_q8_0(w: np.ndarray, rows: int, k: int) -> tuple:
    blocks = w.reshape(rows, k // 32, 34)
    qs = tile_rows(np.ascontiguousarray(blocks[:, :, 2:]).view(np.uint16))
    return qs, tile_rows(f16_field(blocks, 0))


# --------------------------------------------------------------------------------- nibble decoding
# Word m of a 4-bit block holds bytes 2m, 2m+1: elements 2m, 2m+1 in its low nibbles, 2m+16, 2m+17
# in its high ones (ggml puts element j in the low nibble of byte j and j+16 in its high nibble).

@njit(cache=True, inline="always")
def _sum_u4_block(qs, t, b, xq, i, o, part):
    """part[0|1, :] = sums over elements 0..15 | 16..31 of the nibble times the activation."""
    for r in range(R):
        lo = I16(0)
        hi = I16(0)
        for m in range(8):
            v = I16(qs[t, b, m, r])
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
        hl = I16(qh[t, b, 0, r])
        hh = I16(qh[t, b, 1, r])
        for mm in range(4):
            m = m0 + mm
            v = I16(qs[t, b, m, r])
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
            v = I16(qs[t, b, m, r])
            part[m, r] = I16(sext8(v, 0) * xq[i, o + 2 * m] + sext8(v, 1) * xq[i, o + 2 * m + 1])


@njit(cache=True, inline="always")
def _widen_sum(part, ngroups, isum):
    # a literal group count at each call site: the g loop unrolls inside the vectorized row loop
    if ngroups == 2:
        for r in range(R):
            isum[r] = I32(part[0, r]) + I32(part[1, r])
    elif ngroups == 4:
        for r in range(R):
            isum[r] = I32(part[0, r]) + I32(part[1, r]) + I32(part[2, r]) + I32(part[3, r])
    else:
        for r in range(R):
            s = I32(0)
            for g in range(16):
                s += I32(part[g, r])
            isum[r] = s


# ------------------------------------------------------------------------------- scale application
@njit(cache=True, inline="always")
def _acc_offset(acc, isum, off, dw, db):
    """Q4_0 / Q5_0 / Q8_0: acc += (isum - off) * d_w * d_x."""
    for r in range(R):
        acc[r] += F32(isum[r] - off) * (dw[r] * db)


@njit(cache=True, inline="always")
def _acc_min(acc, isum, dw, mw, db, sb):
    """Q4_1 / Q5_1 (ggml: sumf += d_w*d_x*sumi + m_w*s_x, s_x = f16(d_x * sum(x)))."""
    for r in range(R):
        acc[r] += F32(isum[r]) * (dw[r] * db) + mw[r] * sb


@njit(cache=True, inline="always")
def _store_tile(acc, out, i, t):
    base = t * R
    for r in range(min(R, out.shape[1] - base)):
        out[i, base + r] = acc[r]


# -------------------------------------------------------------------------------- batched decoding
# Decode a block of a row tile once into w (32, R) int16, then multiply it into every token.

@njit(cache=True, inline="always")
def _sum_decoded(w, xq, i, o, gsize, part):
    """part[g, :] = sum over elements g*gsize .. (g+1)*gsize-1 of w * x (gsize 16, 8 or 2)."""
    if gsize == 16:
        for r in range(R):
            lo = I16(0)
            hi = I16(0)
            for j in range(16):
                lo = I16(lo + w[j, r] * xq[i, o + j])
                hi = I16(hi + w[16 + j, r] * xq[i, o + 16 + j])
            part[0, r] = lo
            part[1, r] = hi
    elif gsize == 8:
        for h in range(2):
            for r in range(R):
                lo = I16(0)
                hi = I16(0)
                for j in range(8):
                    lo = I16(lo + w[16 * h + j, r] * xq[i, o + 16 * h + j])
                    hi = I16(hi + w[16 * h + 8 + j, r] * xq[i, o + 16 * h + 8 + j])
                part[2 * h, r] = lo
                part[2 * h + 1, r] = hi
    else:
        for m in range(16):
            for r in range(R):
                part[m, r] = I16(w[2 * m, r] * xq[i, o + 2 * m] + w[2 * m + 1, r] * xq[i, o + 2 * m + 1])


@njit(cache=True, inline="always")
def _decode_u4(qs, t, b, w):
    for m in range(8):
        for r in range(R):
            v = I16(qs[t, b, m, r])
            w[2 * m, r] = field(v, 0, 15)
            w[2 * m + 1, r] = field(v, 8, 15)
            w[16 + 2 * m, r] = field(v, 4, 15)
            w[17 + 2 * m, r] = field(v, 12, 15)


@njit(cache=True, inline="always")
def _decode_u5(qs, qh, t, b, w):
    _decode_u4(qs, t, b, w)
    for j in range(16):
        for r in range(R):
            w[j, r] |= bit_to(qh[t, b, 0, r], j, 4)
            w[16 + j, r] |= bit_to(qh[t, b, 1, r], j, 4)


@njit(cache=True, inline="always")
def _decode_i8(qs, t, b, w):
    for m in range(16):
        for r in range(R):
            v = I16(qs[t, b, m, r])
            w[2 * m, r] = sext8(v, 0)
            w[2 * m + 1, r] = sext8(v, 1)


# ------------------------------------------------------------------------------------ tile kernels
@njit(cache=True)
def _tile_q4_0(t, qs, d, xq, dx, xsum, out):
    wide_vectors()
    nb = qs.shape[1]
    n = out.shape[0]
    part = np.empty((2, R), I16)
    isum = np.empty(R, I32)
    acc = np.zeros((n, R), F32)
    if n <= MATVEC_MAX_TOKENS:
        for i in range(n):
            for b in range(nb):
                _sum_u4_block(qs, t, b, xq, i, b * 32, part)
                _widen_sum(part, 2, isum)
                _acc_offset(acc[i], isum, 8 * xsum[i, b], d[t, b], dx[i, b])
    else:
        w = np.empty((32, R), I16)
        for b in range(nb):
            _decode_u4(qs, t, b, w)
            for i in range(n):
                _sum_decoded(w, xq, i, b * 32, 16, part)
                _widen_sum(part, 2, isum)
                _acc_offset(acc[i], isum, 8 * xsum[i, b], d[t, b], dx[i, b])
    for i in range(n):
        _store_tile(acc[i], out, i, t)


@njit(cache=True)
def _tile_q4_1(t, qs, d, m, xq, dx, xs, out):
    wide_vectors()
    nb = qs.shape[1]
    n = out.shape[0]
    part = np.empty((2, R), I16)
    isum = np.empty(R, I32)
    acc = np.zeros((n, R), F32)
    if n <= MATVEC_MAX_TOKENS:
        for i in range(n):
            for b in range(nb):
                _sum_u4_block(qs, t, b, xq, i, b * 32, part)
                _widen_sum(part, 2, isum)
                _acc_min(acc[i], isum, d[t, b], m[t, b], dx[i, b], xs[i, b])
    else:
        w = np.empty((32, R), I16)
        for b in range(nb):
            _decode_u4(qs, t, b, w)
            for i in range(n):
                _sum_decoded(w, xq, i, b * 32, 16, part)
                _widen_sum(part, 2, isum)
                _acc_min(acc[i], isum, d[t, b], m[t, b], dx[i, b], xs[i, b])
    for i in range(n):
        _store_tile(acc[i], out, i, t)


@njit(cache=True)
def _tile_q5_0(t, qs, qh, d, xq, dx, xsum, out):
    wide_vectors()
    nb = qs.shape[1]
    n = out.shape[0]
    part = np.empty((4, R), I16)
    isum = np.empty(R, I32)
    acc = np.zeros((n, R), F32)
    if n <= MATVEC_MAX_TOKENS:
        for i in range(n):
            for b in range(nb):
                _sum_u5_half(qs, qh, t, b, xq, i, b * 32, 0, part, 0)
                _sum_u5_half(qs, qh, t, b, xq, i, b * 32, 4, part, 2)
                _widen_sum(part, 4, isum)
                _acc_offset(acc[i], isum, 16 * xsum[i, b], d[t, b], dx[i, b])
    else:
        w = np.empty((32, R), I16)
        for b in range(nb):
            _decode_u5(qs, qh, t, b, w)
            for i in range(n):
                _sum_decoded(w, xq, i, b * 32, 8, part)
                _widen_sum(part, 4, isum)
                _acc_offset(acc[i], isum, 16 * xsum[i, b], d[t, b], dx[i, b])
    for i in range(n):
        _store_tile(acc[i], out, i, t)


@njit(cache=True)
def _tile_q5_1(t, qs, qh, d, m, xq, dx, xs, out):
    wide_vectors()
    nb = qs.shape[1]
    n = out.shape[0]
    part = np.empty((4, R), I16)
    isum = np.empty(R, I32)
    acc = np.zeros((n, R), F32)
    if n <= MATVEC_MAX_TOKENS:
        for i in range(n):
            for b in range(nb):
                _sum_u5_half(qs, qh, t, b, xq, i, b * 32, 0, part, 0)
                _sum_u5_half(qs, qh, t, b, xq, i, b * 32, 4, part, 2)
                _widen_sum(part, 4, isum)
                _acc_min(acc[i], isum, d[t, b], m[t, b], dx[i, b], xs[i, b])
    else:
        w = np.empty((32, R), I16)
        for b in range(nb):
            _decode_u5(qs, qh, t, b, w)
            for i in range(n):
                _sum_decoded(w, xq, i, b * 32, 8, part)
                _widen_sum(part, 4, isum)
                _acc_min(acc[i], isum, d[t, b], m[t, b], dx[i, b], xs[i, b])
    for i in range(n):
        _store_tile(acc[i], out, i, t)


@njit(cache=True)
def _tile_q8_0(t, qs, d, xq, dx, xsum, out):
    wide_vectors()
    nb = qs.shape[1]
    n = out.shape[0]
    part = np.empty((16, R), I16)
    isum = np.empty(R, I32)
    acc = np.zeros((n, R), F32)
    if n <= MATVEC_MAX_TOKENS:
        for i in range(n):
            for b in range(nb):
                _sum_i8_block(qs, t, b, xq, i, b * 32, part)
                _widen_sum(part, 16, isum)
                _acc_offset(acc[i], isum, 0, d[t, b], dx[i, b])
    else:
        w = np.empty((32, R), I16)
        for b in range(nb):
            _decode_i8(qs, t, b, w)
            for i in range(n):
                _sum_decoded(w, xq, i, b * 32, 2, part)
                _widen_sum(part, 16, isum)
                _acc_offset(acc[i], isum, 0, d[t, b], dx[i, b])
    for i in range(n):
        _store_tile(acc[i], out, i, t)


# -------------------------------------------------------------------------------- parallel drivers
@njit(cache=True, parallel=True)
def mul_mat_q4_0(qs, d, xq, dx, xsum, out):
    for t in prange(qs.shape[0]):
        _tile_q4_0(t, qs, d, xq, dx, xsum, out)


@njit(cache=True, parallel=True)
def mul_mat_q4_1(qs, d, m, xq, dx, xs, out):
    for t in prange(qs.shape[0]):
        _tile_q4_1(t, qs, d, m, xq, dx, xs, out)


@njit(cache=True, parallel=True)
def mul_mat_q5_0(qs, qh, d, xq, dx, xsum, out):
    for t in prange(qs.shape[0]):
        _tile_q5_0(t, qs, qh, d, xq, dx, xsum, out)


@njit(cache=True, parallel=True)
def mul_mat_q5_1(qs, qh, d, m, xq, dx, xs, out):
    for t in prange(qs.shape[0]):
        _tile_q5_1(t, qs, qh, d, m, xq, dx, xs, out)


@njit(cache=True, parallel=True)
def mul_mat_q8_0(qs, d, xq, dx, xsum, out):
    for t in prange(qs.shape[0]):
        _tile_q8_0(t, qs, d, xq, dx, xsum, out)


# ---------------------------------------------------------------------------------- serial drivers
# For small products, where starting a parallel region costs more than the work (see threads.py).
@njit(cache=True)
def mul_mat_q4_0_serial(qs, d, xq, dx, xsum, out):
    for t in range(qs.shape[0]):
        _tile_q4_0(t, qs, d, xq, dx, xsum, out)


@njit(cache=True)
def mul_mat_q4_1_serial(qs, d, m, xq, dx, xs, out):
    for t in range(qs.shape[0]):
        _tile_q4_1(t, qs, d, m, xq, dx, xs, out)


@njit(cache=True)
def mul_mat_q5_0_serial(qs, qh, d, xq, dx, xsum, out):
    for t in range(qs.shape[0]):
        _tile_q5_0(t, qs, qh, d, xq, dx, xsum, out)


@njit(cache=True)
def mul_mat_q5_1_serial(qs, qh, d, m, xq, dx, xs, out):
    for t in range(qs.shape[0]):
        _tile_q5_1(t, qs, qh, d, m, xq, dx, xs, out)


@njit(cache=True)
def mul_mat_q8_0_serial(qs, d, xq, dx, xsum, out):
    for t in range(qs.shape[0]):
        _tile_q8_0(t, qs, d, xq, dx, xsum, out)
