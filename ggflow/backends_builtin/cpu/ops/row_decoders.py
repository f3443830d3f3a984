"""Rows of the legacy quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) decoded to float32 in one numba call.

A decode step reads one row of the token embedding (get_rows). The type's ``to_float`` takes some ten numpy
calls for it, each slow right after the lm_head's stream has left the interpreter out of cache; here it is one
numba call (docs/performance.md, "Per-step overhead").

The values are the ones ``to_float`` gives, bit for bit (tests/test_cpu_rows.py): ggml's blocks, the scale an
IEEE half read exactly, ``q * d`` then ``+ m`` in float32, two roundings (q * d is exact: at most 16 significant
bits, so a contracted FMA would give the same). Other types keep ``to_float``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu import entry_points
from ggflow.backends_builtin.cpu.products.qmm.floats import f16_bits_to_f32
from ggflow.core.types import TypeTraits

F32 = np.float32
QK = 32   # elements per block of every type here


@njit(cache=True, inline="always")
def _half(raw, i, o):
    """The IEEE half at bytes o, o + 1 of row i, as float32."""
    return f16_bits_to_f32(np.uint16(raw[i, o]) | (np.uint16(raw[i, o + 1]) << np.uint16(8)))


@njit(cache=True, inline="always")
def _high_bits(raw, i, o):
    """A Q5 block's 32 fifth bits, the little-endian uint32 at bytes o .. o + 3 of row i."""
    return (np.uint32(raw[i, o]) | (np.uint32(raw[i, o + 1]) << np.uint32(8))
            | (np.uint32(raw[i, o + 2]) << np.uint32(16)) | (np.uint32(raw[i, o + 3]) << np.uint32(24)))


@njit(cache=True, inline="always")
def _five_bit_pair(raw, i, o, qh, j):
    """Elements j and j + 16 of a Q5 block whose nibbles start at byte o: byte j's nibbles, fifth bits j and j + 16."""
    q = np.uint32(raw[i, o + j])
    return (q & 0x0F) | (((qh >> np.uint32(j)) & 1) << 4), (q >> 4) | (((qh >> np.uint32(j + 16)) & 1) << 4)


@njit(cache=True, nogil=True)
def decode_q4_0(raw, out):
    """raw (n, row bytes) of Q4_0 blocks (d, 16 bytes of nibbles: element j low, j + 16 high) -> out (n, ne0)."""
    for i in range(out.shape[0]):
        for b in range(out.shape[1] // QK):
            o, y = b * 18, out[i, b * QK:(b + 1) * QK]
            d = _half(raw, i, o)
            for j in range(16):
                q = raw[i, o + 2 + j]
                y[j] = F32(np.int32(q & 0x0F) - 8) * d
                y[j + 16] = F32(np.int32(q >> 4) - 8) * d


@njit(cache=True, nogil=True)
def decode_q4_1(raw, out):
    """Q4_1 blocks (d, m, 16 bytes of nibbles): q * d + m."""
    for i in range(out.shape[0]):
        for b in range(out.shape[1] // QK):
            o, y = b * 20, out[i, b * QK:(b + 1) * QK]
            d, m = _half(raw, i, o), _half(raw, i, o + 2)
            for j in range(16):
                q = raw[i, o + 4 + j]
                y[j] = F32(q & 0x0F) * d + m
                y[j + 16] = F32(q >> 4) * d + m


@njit(cache=True, nogil=True)
def decode_q5_0(raw, out):
    """Q5_0 blocks (d, 32 fifth bits, 16 bytes of nibbles): (q | fifth bit << 4) - 16, times d."""
    for i in range(out.shape[0]):
        for b in range(out.shape[1] // QK):
            o, y = b * 22, out[i, b * QK:(b + 1) * QK]
            d, qh = _half(raw, i, o), _high_bits(raw, i, o + 2)
            for j in range(16):
                lo, hi = _five_bit_pair(raw, i, o + 6, qh, j)
                y[j] = F32(np.int32(lo) - 16) * d
                y[j + 16] = F32(np.int32(hi) - 16) * d


@njit(cache=True, nogil=True)
def decode_q5_1(raw, out):
    """Q5_1 blocks (d, m, 32 fifth bits, 16 bytes of nibbles): (q | fifth bit << 4) * d + m."""
    for i in range(out.shape[0]):
        for b in range(out.shape[1] // QK):
            o, y = b * 24, out[i, b * QK:(b + 1) * QK]
            d, m, qh = _half(raw, i, o), _half(raw, i, o + 2), _high_bits(raw, i, o + 4)
            for j in range(16):
                lo, hi = _five_bit_pair(raw, i, o + 8, qh, j)
                y[j] = F32(lo) * d + m
                y[j + 16] = F32(hi) * d + m


@njit(cache=True, nogil=True)
def decode_q8_0(raw, out):
    """Q8_0 blocks (d, 32 int8): q * d."""
    for i in range(out.shape[0]):
        for b in range(out.shape[1] // QK):
            o, y = b * 34, out[i, b * QK:(b + 1) * QK]
            d = _half(raw, i, o)
            for j in range(QK):
                y[j] = F32(np.int8(raw[i, o + 2 + j])) * d


# type name -> (its decoder, bytes per block)
DECODERS = {"Q4_0": (decode_q4_0, 18), "Q4_1": (decode_q4_1, 20), "Q5_0": (decode_q5_0, 22),
            "Q5_1": (decode_q5_1, 24), "Q8_0": (decode_q8_0, 34)}


def bind_decoder(traits: TypeTraits, raw: np.ndarray, out: np.ndarray) -> Callable[[], None] | None:
    """A call that decodes raw (n, row bytes) uint8 rows of the type ``traits`` into out (n, ne0) float32, both
    C-contiguous; None where this module has no decoder for the type, or the arrays are in another form."""
    decoder, block_bytes = DECODERS.get(traits.name, (None, 0))
    if (decoder is None or traits.block_size != QK or traits.type_size != block_bytes
            or raw.dtype != np.uint8 or out.dtype != F32 or raw.ndim != 2 or out.ndim != 2
            or not (raw.flags.c_contiguous and out.flags.c_contiguous) or raw.shape[0] != out.shape[0]
            or out.shape[1] % QK or raw.shape[1] != out.shape[1] // QK * block_bytes):
        return None
    return entry_points.bind(decoder, raw, out)
