"""MXFP4's pieces for the CPU matmul skeleton (see ``cpu_pieces``): gpt-oss's experts run in the packed kernels.

The E2M1 table (doubled: 0..12, signed) is looked up once, when the weight is packed, into int8 values two
per uint16 word, and each block's E8M0 scale is kept as the float32 ggml computes (half the E8M0 value): 36
bytes per 32 weights. A table value times an int8 activation is at most 12 * 127, so two products fit int16:
16 groups of 2 per block. The dot is ggml's ggml_vec_dot_mxfp4_q8_0: the exact integer sum of a block's
products times (scale * the activation block's scale), accumulated in float32.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.products.qmm.int16 import sext8
from ggflow.backends_builtin.cpu.products.qmm.layout import check_tile, tile_rows
from ggflow.plugins.cpu_pieces import BlockPieces

TILE = 64
check_tile(TILE, __name__)
QK, BLOCK_BYTES = 32, 17
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def pack(w: np.ndarray, rows: int, k: int) -> tuple:
    """(rows, row bytes) -> (table values as int8, two per uint16 word (tiles, nb, 16, TILE); scales f32)."""
    blocks = w.reshape(rows, k // QK, BLOCK_BYTES)
    qs = blocks[:, :, 1:]
    values = np.ascontiguousarray(KVALUES[np.concatenate([qs & 15, qs >> 4], axis=2)])   # (rows, nb, 32)
    e = blocks[:, :, 0].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return tile_rows(values.view(np.uint16)), tile_rows(bits.view(np.float32))


# Word m of a block holds elements 2m (low byte) and 2m + 1 (high byte).
@njit(cache=True, inline="always")
def block_sums(w, t, b, xq, i, o, part):
    qs = w[0]
    for m in range(16):
        for r in range(TILE):
            v = np.int16(qs[t, b, m, r])
            part[m, r] = np.int16(sext8(v, 0) * xq[i, o + 2 * m] + sext8(v, 1) * xq[i, o + 2 * m + 1])


@njit(cache=True, inline="always")
def decode(w, t, b, wd):
    qs = w[0]
    for m in range(16):
        for r in range(TILE):
            v = np.int16(qs[t, b, m, r])
            wd[2 * m, r] = sext8(v, 0)
            wd[2 * m + 1, r] = sext8(v, 1)


@njit(cache=True, inline="always")
def accumulate(acc, part, w, t, b, dx, xe, i):
    d = w[1]
    db = dx[i, b]
    for r in range(TILE):
        s = np.int32(0)
        for g in range(16):
            s = np.int32(s + np.int32(part[g, r]))
        acc[r] += (d[t, b, r] * db) * np.float32(s)


PIECES = {"MXFP4": BlockPieces(QK, 16, pack, block_sums, decode, accumulate)}
