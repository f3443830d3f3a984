"""The legacy 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.

Each ``*_from_float`` reproduces ggml's ``quantize_row_*_ref`` byte for byte and each
``*_to_float`` its ``dequantize_row_*`` bit for bit (see docs/quantization.md). The arithmetic
is float32 in the order C does it; the C-only behaviours (roundf, float -> int8 casts, the
first-largest-|x| scan, fp16 NaN) come from ``_blocks``.

Layouts (little-endian; element j of a 4-bit block sits in byte j % 16, low nibble if j < 16):
    Q4_0  d:f16                qs:16 bytes      x = (q - 8) * d
    Q4_1  d:f16  m:f16         qs:16 bytes      x = q * d + m
    Q5_0  d:f16  qh:u32        qs:16 bytes      x = (q - 16) * d      q's 5th bit: bit j of qh
    Q5_1  d:f16  m:f16  qh:u32 qs:16 bytes      x = q * d + m
    Q8_0  d:f16                qs:32 int8       x = q * d
    Q8_1  d:f16  s:f16         qs:32 int8       x = q * d;  s = fp16(d * sum(q))
"""
from __future__ import annotations

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.errors import QuantizationError
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin._blocks import (
    as_records, c_float_to_int8, c_float_to_uint8, check_byte_blocks, check_float_blocks,
    fp16_to_fp32, fp32_to_fp16_bits, pack_nibbles, records_to_bytes, require_finite,
    round_half_away, safe_reciprocal, signed_absmax, unpack_nibbles)

QK = 32  # elements per block, the same for every legacy format

Q4_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
Q4_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
Q5_0_BLOCK = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)])
Q5_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)])
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
Q8_1_BLOCK = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)])

_BIT_WEIGHTS = np.uint32(1) << np.arange(QK, dtype=np.uint32)  # bit j of qh <-> element j


# -- shared steps ----------------------------------------------------------------------------
def _prepare(blocks: np.ndarray, name: str) -> np.ndarray:
    blocks = check_float_blocks(blocks, name, QK)
    require_finite(blocks, name)
    return blocks


def _new_records(n: int, block_dtype: np.dtype) -> np.ndarray:
    return np.zeros(n, dtype=block_dtype)


def _to_f16(x: np.ndarray) -> np.ndarray:
    return fp32_to_fp16_bits(x).view("<f2")


def _split_high_bits(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """5-bit values (n, 32) -> (low nibbles packed (n, 16), the 5th bits as one uint32 each)."""
    q = q.astype(np.uint8)
    high = ((q >> np.uint8(4)) & np.uint8(1)).astype(np.uint32)
    return pack_nibbles(q & np.uint8(0x0F)), (high * _BIT_WEIGHTS).sum(axis=-1, dtype=np.uint32)


def _join_high_bits(qs: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """Inverse of _split_high_bits: (n, 16) bytes + (n,) uint32 -> (n, 32) values 0..31."""
    high = ((qh[:, None] >> np.arange(QK, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
    return unpack_nibbles(qs) | (high << np.uint8(4))


def _symmetric_scale(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0/Q5_0: d = max / -levels, where max is the signed element of largest |x|; so the
    largest-magnitude element maps to q = 0 exactly and the other end gets one more step."""
    d = signed_absmax(blocks) / np.float32(-levels)
    return d, safe_reciprocal(d)


def _minmax_scale(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1/Q5_1: d = (max - min) / levels. argmin/argmax keep the first of equal values, as C's
    strict comparisons do, so the sign of a zero min (stored in m) matches."""
    lo = np.take_along_axis(blocks, np.argmin(blocks, axis=1)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(blocks, np.argmax(blocks, axis=1)[:, None], axis=1)[:, 0]
    with np.errstate(over="ignore"):
        d = (hi - lo) / np.float32(levels)
    return d, safe_reciprocal(d), lo


def _scaled(blocks: np.ndarray, inv: np.ndarray, offset: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if offset is not None:
            blocks = blocks - offset[:, None]
        return blocks * inv[:, None]


def _absmax_scale(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0/Q8_1: d = max|x| / 127."""
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    return d, safe_reciprocal(d)


def _clamped_nibble(v: np.ndarray, bias: float, top: int) -> np.ndarray:
    """``MIN(top, (int8_t)(v + bias))``: a signed compare on the int8, then stored as a byte."""
    with np.errstate(invalid="ignore"):
        q = c_float_to_int8(v + np.float32(bias))
    return np.minimum(q, np.int8(top)).view(np.uint8)


def _scale_values(q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """``q*d`` (then ``+ m``) in float32, as C does. q*d has at most 16 significant bits, so it
    is exact in float32 and a compiler contracting ``q*d + m`` into an FMA gets the same result."""
    with np.errstate(invalid="ignore"):  # an inf scale (stored by ggml for huge blocks) gives NaN
        x = q.astype(np.float32) * fp16_to_fp32(d)[:, None]
        return x if m is None else x + fp16_to_fp32(m)[:, None]


# -- Q4_0 ------------------------------------------------------------------------------------
def q4_0_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = _prepare(blocks, "Q4_0")
    d, inv = _symmetric_scale(blocks, 8)
    rec = _new_records(len(blocks), Q4_0_BLOCK)
    rec["d"] = _to_f16(d)
    rec["qs"] = pack_nibbles(_clamped_nibble(_scaled(blocks, inv), 8.5, 15))
    return records_to_bytes(rec)


def q4_0_to_float(blocks: np.ndarray) -> np.ndarray:
    rec = as_records(check_byte_blocks(blocks, "Q4_0", Q4_0_BLOCK.itemsize), Q4_0_BLOCK)
    return _scale_values(unpack_nibbles(rec["qs"]).astype(np.int32) - 8, rec["d"])


# -- Q4_1 ------------------------------------------------------------------------------------
def q4_1_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = _prepare(blocks, "Q4_1")
    d, inv, lo = _minmax_scale(blocks, 15)
    rec = _new_records(len(blocks), Q4_1_BLOCK)
    rec["d"], rec["m"] = _to_f16(d), _to_f16(lo)
    rec["qs"] = pack_nibbles(_clamped_nibble(_scaled(blocks, inv, lo), 0.5, 15))
    return records_to_bytes(rec)


def q4_1_to_float(blocks: np.ndarray) -> np.ndarray:
    rec = as_records(check_byte_blocks(blocks, "Q4_1", Q4_1_BLOCK.itemsize), Q4_1_BLOCK)
    return _scale_values(unpack_nibbles(rec["qs"]), rec["d"], rec["m"])


# -- Q5_0 ------------------------------------------------------------------------------------
def q5_0_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = _prepare(blocks, "Q5_0")
    d, inv = _symmetric_scale(blocks, 16)
    rec = _new_records(len(blocks), Q5_0_BLOCK)
    rec["d"] = _to_f16(d)
    rec["qs"], rec["qh"] = _split_high_bits(_clamped_nibble(_scaled(blocks, inv), 16.5, 31))
    return records_to_bytes(rec)


def q5_0_to_float(blocks: np.ndarray) -> np.ndarray:
    rec = as_records(check_byte_blocks(blocks, "Q5_0", Q5_0_BLOCK.itemsize), Q5_0_BLOCK)
    return _scale_values(_join_high_bits(rec["qs"], rec["qh"]).astype(np.int32) - 16, rec["d"])


# -- Q5_1 ------------------------------------------------------------------------------------
def q5_1_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = _prepare(blocks, "Q5_1")
    d, inv, lo = _minmax_scale(blocks, 31)
    rec = _new_records(len(blocks), Q5_1_BLOCK)
    rec["d"], rec["m"] = _to_f16(d), _to_f16(lo)
    # Unlike Q4_1, C has no MIN(31, ...) here: (uint8_t)(v + 0.5f) straight.
    with np.errstate(invalid="ignore"):
        q = c_float_to_uint8(_scaled(blocks, inv, lo) + np.float32(0.5))
    rec["qs"], rec["qh"] = _split_high_bits(q)
    return records_to_bytes(rec)


def q5_1_to_float(blocks: np.ndarray) -> np.ndarray:
    rec = as_records(check_byte_blocks(blocks, "Q5_1", Q5_1_BLOCK.itemsize), Q5_1_BLOCK)
    return _scale_values(_join_high_bits(rec["qs"], rec["qh"]), rec["d"], rec["m"])


# -- Q8_0 / Q8_1 -----------------------------------------------------------------------------
def _q8_quants(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, inv = _absmax_scale(blocks)
    return d, c_float_to_int8(round_half_away(_scaled(blocks, inv)))


def q8_0_from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
    """quant_weights: accepted and unused, as ggml's quantize_* ignores them for this type."""
    blocks = _prepare(blocks, "Q8_0")
    d, q = _q8_quants(blocks)
    rec = _new_records(len(blocks), Q8_0_BLOCK)
    rec["d"], rec["qs"] = _to_f16(d), q
    return records_to_bytes(rec)


def q8_0_to_float(blocks: np.ndarray) -> np.ndarray:
    rec = as_records(check_byte_blocks(blocks, "Q8_0", Q8_0_BLOCK.itemsize), Q8_0_BLOCK)
    return _scale_values(rec["qs"], rec["d"])


def q8_1_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = _prepare(blocks, "Q8_1")
    d, q = _q8_quants(blocks)
    rec = _new_records(len(blocks), Q8_1_BLOCK)
    rec["d"], rec["qs"] = _to_f16(d), q
    # s uses the float32 d, not the fp16-rounded one: `sum*d` with an int sum, as ggml writes it.
    rec["s"] = _to_f16(q.sum(axis=1, dtype=np.int32).astype(np.float32) * d)
    return records_to_bytes(rec)


def q8_1_to_float(blocks: np.ndarray) -> np.ndarray:
    """ggml has no Q8_1 dequantizer (Q8_1 only ever holds activations); ours is q * d, like Q8_0."""
    rec = as_records(check_byte_blocks(blocks, "Q8_1", Q8_1_BLOCK.itemsize), Q8_1_BLOCK)
    return _scale_values(rec["qs"], rec["d"])


# -- with importance weights (ggml's quantize_row_q*_impl; _legacy_weighted) -----------------------
def _weighted(name: str, plain, block_dtype: np.dtype):
    """plain's from_float, or given quant_weights ((n_blocks, 32), as blocks) and n_per_row (the row length:
    ggml weighs by the row's mean square), ggml's weighted encoder of that type."""
    def from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None,
                   n_per_row: int | None = None) -> np.ndarray:
        if quant_weights is None:
            return plain(blocks)
        blocks = _prepare(blocks, name)
        qw = np.ascontiguousarray(quant_weights, dtype=np.float32)
        if qw.shape != blocks.shape:
            raise QuantizationError(f"{name}: importance weights of shape {qw.shape} for blocks of shape "
                                    f"{blocks.shape}; they must match element for element")
        if n_per_row is None or n_per_row % QK or blocks.size % n_per_row:
            raise QuantizationError(f"{name}: importance weights need the row length (n_per_row), a multiple "
                                    f"of {QK} dividing the {blocks.size} elements, not {n_per_row}")
        rows = blocks.reshape(-1, n_per_row)
        out = np.zeros((rows.shape[0], n_per_row // QK * block_dtype.itemsize), np.uint8)
        from ggflow.quant_builtin import _legacy_weighted   # numba compiles on first use
        getattr(_legacy_weighted, f"quantize_{name.lower()}_w")(rows, qw.reshape(rows.shape), out)
        return out.reshape(blocks.shape[0], block_dtype.itemsize)
    from_float.__name__ = plain.__name__
    return from_float


Q4_0 = TypeTraits("Q4_0", 2, QK, Q4_0_BLOCK.itemsize, q4_0_to_float, _weighted("Q4_0", q4_0_from_float, Q4_0_BLOCK),
                  "Q8_0", Q4_0_BLOCK)
Q4_1 = TypeTraits("Q4_1", 3, QK, Q4_1_BLOCK.itemsize, q4_1_to_float, _weighted("Q4_1", q4_1_from_float, Q4_1_BLOCK),
                  "Q8_1", Q4_1_BLOCK)
Q5_0 = TypeTraits("Q5_0", 6, QK, Q5_0_BLOCK.itemsize, q5_0_to_float, _weighted("Q5_0", q5_0_from_float, Q5_0_BLOCK),
                  "Q8_0", Q5_0_BLOCK)
Q5_1 = TypeTraits("Q5_1", 7, QK, Q5_1_BLOCK.itemsize, q5_1_to_float, _weighted("Q5_1", q5_1_from_float, Q5_1_BLOCK),
                  "Q8_1", Q5_1_BLOCK)
Q8_0 = TypeTraits("Q8_0", 8, QK, Q8_0_BLOCK.itemsize, q8_0_to_float, q8_0_from_float, "Q8_0", Q8_0_BLOCK)
Q8_1 = TypeTraits("Q8_1", 9, QK, Q8_1_BLOCK.itemsize, q8_1_to_float, q8_1_from_float, "Q8_1", Q8_1_BLOCK)


@hookimpl
def register_quant_types(register):
    for traits in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1):
        register(traits)
