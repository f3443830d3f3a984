"""IQ4_NL as a plugin quant type: its format (TypeTraits) and its CPU matmul pieces.

ggflow now builds IQ4_NL in (quant_builtin): installing this example replaces the built-in one, with a
PluginOverrideWarning, which is what it shows: a plugin type with pieces, and how an override is said.

Format (ggml's block_iq4_nl, 32 weights in 18 bytes): an f16 scale d, then 16 bytes of 4-bit indices
into a fixed non-linear table (element j in the low nibble of byte j, element j + 16 in the high one);
weight = d * KVALUES[index]. Dot products quantize the activations to Q8_0, as ggml does.

The CPU pieces (see ggflow.plugins.cpu_pieces) look the table up once, when the weight
is packed, and keep int8 values in row tiles: 36 bytes per 32 weights in memory, twice the file's 18.
Looking the nibbles up inside the kernel's loop instead keeps LLVM from vectorising it (a gather per
weight: a matvec measured 20x slower than Q4_0's). A table value times an int8 activation is up to
127 * 127, so two products fit int16: 16 groups of 2 per block.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.plugins.cpu_pieces import TILE, BlockPieces, f16_field, sext8, tile_rows
from ggflow.core.types import TypeTraits

QK = 32
BLOCK_BYTES = 2 + QK // 2
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16)
_MIDPOINTS = (KVALUES[1:] + KVALUES[:-1]) / 2.0


# -- the format ----------------------------------------------------------------------------------
def to_float(blocks: np.ndarray) -> np.ndarray:
    """(n, 18) uint8 -> (n, 32) float32."""
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 2:]
    idx = np.concatenate([qs & 15, qs >> 4], axis=1)
    return d * KVALUES[idx].astype(np.float32)


def from_float(x: np.ndarray) -> np.ndarray:
    """(n, 32) float32 -> (n, 18) uint8: ggml's first scale (the value of largest magnitude maps to
    -127) and the nearest table entry for each weight. ggml then tries 15 more scales near it and keeps
    the best; this encoder does not, so its error is a little larger, and its bytes are valid IQ4_NL."""
    x = np.asarray(x, np.float32)
    amax_at = np.abs(x).argmax(axis=1)
    vmax = np.take_along_axis(x, amax_at[:, None], axis=1)[:, 0]
    d = (vmax / KVALUES[0]).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(len(x), np.float32), where=d != 0)
    idx = np.searchsorted(_MIDPOINTS, x * inv[:, None]).astype(np.uint8)
    out = np.empty((len(x), BLOCK_BYTES), np.uint8)
    out[:, :2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:] = idx[:, :16] | (idx[:, 16:] << 4)
    return out


# -- the CPU pieces ------------------------------------------------------------------------------
def pack(w: np.ndarray, rows: int, k: int) -> tuple:
    """(rows, row bytes) -> (the weights' table values as int8, two per uint16 word; scales as f32)."""
    blocks = w.reshape(rows, k // QK, BLOCK_BYTES)
    qs = blocks[:, :, 2:]
    values = KVALUES.astype(np.int8)[np.concatenate([qs & 15, qs >> 4], axis=2)]   # (rows, nb, 32)
    return tile_rows(values.view(np.uint16)), tile_rows(f16_field(blocks, 0))       # (tiles, nb, 16, TILE)


# Word m of a block holds elements 2m (low byte) and 2m + 1 (high byte), each a signed table value.
@njit(cache=True, inline="always")
def block_sums(w, t, b, xq, i, o, part):
    qs = w[0]
    for m in range(16):       # m outside: one store stream per vectorized row loop
        for r in range(TILE):
            v = np.int16(qs[t, b, m, r])
            # np.int16(...) around the sum: LLVM then keeps the row loop in 16-bit lanes
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
            s = np.int32(s + np.int32(part[g, r]))   # numba adds int32s in int64: cast back, 32-bit lanes
        acc[r] += np.float32(s) * (d[t, b, r] * db)


IQ4_NL = TypeTraits(
    "IQ4_NL", 20, QK, BLOCK_BYTES, to_float, from_float, "Q8_0",
    kernels={"cpu": BlockPieces(QK, 16, pack, block_sums, decode, accumulate)})
