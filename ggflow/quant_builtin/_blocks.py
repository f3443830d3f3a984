"""Shared building blocks for the built-in quant types: exact C scalar semantics, vectorized.

ggml's reference quantizers are scalar C. Reproducing them byte for byte in numpy means
reproducing a few C behaviours numpy does not have by default: ``roundf`` (half away from
zero), float -> int8 casts (x86-64 truncates through a 32-bit ``cvttss2si``), ggml's own
fp16 conversion (NaN becomes 0x7E00), and the "first element with the largest |x|" scan.
Every function here works on whole arrays of blocks; none loops in Python.

This module is a stable API for every module in ``ggflow.quant_builtin``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.errors import QuantizationError

FP16 = np.dtype("<f2")
_INT32_MIN = np.int32(-(2**31))


# -- half precision --------------------------------------------------------------------------
def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half bits (uint16) exactly as ggml's GGML_FP32_TO_FP16.

    Finite values and infinities round to nearest even, like numpy's cast; every NaN becomes a
    quiet NaN with payload 0x200 and the input's sign (numpy would keep the payload's top bits).
    """
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(FP16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        bits = bits.copy()
        sign = (x.view(np.uint32)[nan] >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
        bits[nan] = sign | np.uint16(0x7E00)
    return bits


def fp16_to_fp32(h: np.ndarray) -> np.ndarray:
    """IEEE half (as float16 or its uint16 bits) -> float32; exact, as GGML_FP16_TO_FP32."""
    h = np.asarray(h)
    if h.dtype != FP16:
        h = h.astype(np.uint16, copy=False).view(FP16)
    return h.astype(np.float32)


# -- C scalar semantics ----------------------------------------------------------------------
def round_half_away(x: np.ndarray) -> np.ndarray:
    """C ``roundf``: nearest integer, halves away from zero (np.round rounds halves to even).

    ``x + 0.5`` then truncating is not the same: 0.49999997f + 0.5f rounds up to 1.0f.
    The fractional part ``x - trunc(x)`` is exact in float32, so this is.
    """
    x = np.asarray(x, dtype=np.float32)
    whole = np.trunc(x)
    with np.errstate(invalid="ignore"):  # inf - inf for infinite x: stays inf below
        frac = x - whole
        bump = np.abs(frac) >= np.float32(0.5)
    return np.where(bump, whole + np.sign(x), whole).astype(np.float32)


def c_float_to_int32(x: np.ndarray) -> np.ndarray:
    """C float -> int conversion as x86-64 does it (``cvttss2si``): truncate toward zero;
    NaN and values outside int32 give INT32_MIN. Defined for every input, unlike numpy's cast."""
    x = np.asarray(x, dtype=np.float32)
    fits = (x >= np.float32(-(2.0**31))) & (x < np.float32(2.0**31))  # False for NaN
    return np.where(fits, np.where(fits, x, 0).astype(np.int32), _INT32_MIN)


def c_float_to_int8(x: np.ndarray) -> np.ndarray:
    """``(int8_t)f`` as GCC/Clang compile it on x86-64: 32-bit conversion, then the low byte."""
    return c_float_to_int32(x).astype(np.int8)


def c_float_to_uint8(x: np.ndarray) -> np.ndarray:
    """``(uint8_t)f`` on x86-64: 32-bit conversion, then the low byte."""
    return c_float_to_int32(x).astype(np.uint8)


def signed_absmax(x: np.ndarray) -> np.ndarray:
    """Per row of (n, k): the element with the largest |x|, first one on ties, +0.0 if all are 0.

    That is ggml's ``if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`` scan started at 0:
    the sign of the winner matters (it sets the sign of the scale), so does +0.0 vs -0.0.
    """
    x = np.asarray(x, dtype=np.float32)
    mag = np.abs(x)
    at = np.argmax(mag, axis=-1)[..., None]
    winner = np.take_along_axis(x, at, axis=-1)[..., 0]
    return np.where(np.take_along_axis(mag, at, axis=-1)[..., 0] > 0, winner, np.float32(0.0))


def safe_reciprocal(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f/d : 0.0f`` in float32 (1/d overflows to inf for tiny d, as in C)."""
    d = np.asarray(d, dtype=np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0))


# -- nibbles ---------------------------------------------------------------------------------
def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., m) bytes -> (..., 2m) values: all low nibbles first, then all high nibbles
    (ggml packs element j and element j + m into byte j)."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Inverse of unpack_nibbles: (..., 2m) values in 0..15 -> (..., m) bytes."""
    q = np.asarray(q, dtype=np.uint8)
    m = q.shape[-1] // 2
    return (q[..., :m] & np.uint8(0x0F)) | (q[..., m:] << np.uint8(4))


# -- block records ---------------------------------------------------------------------------
def check_float_blocks(blocks: np.ndarray, name: str, block_size: int) -> np.ndarray:
    """Validate a from_float input: (n_blocks, block_size) float32, returned contiguous."""
    blocks = np.ascontiguousarray(blocks, dtype=np.float32)
    if blocks.ndim != 2 or blocks.shape[1] != block_size:
        raise QuantizationError(
            f"{name}: from_float takes (n_blocks, {block_size}) floats, got shape {blocks.shape}")
    return blocks


def check_byte_blocks(blocks: np.ndarray, name: str, type_size: int) -> np.ndarray:
    """Validate a to_float input: (n_blocks, type_size) uint8, returned contiguous."""
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8:
        raise QuantizationError(f"{name}: to_float takes uint8 bytes, got {blocks.dtype}")
    if blocks.ndim != 2 or blocks.shape[1] != type_size:
        raise QuantizationError(
            f"{name}: to_float takes (n_blocks, {type_size}) bytes, got shape {blocks.shape}")
    return np.ascontiguousarray(blocks)


def require_finite(blocks: np.ndarray, name: str) -> None:
    """Quantized formats have no encoding for inf/NaN (ggml's output for them is undefined)."""
    if not np.isfinite(blocks).all():
        bad = np.flatnonzero(~np.isfinite(blocks.reshape(-1)))
        raise QuantizationError(
            f"{name}: cannot quantize non-finite values ({bad.size} found, first at flat index "
            f"{bad[0]}: {blocks.reshape(-1)[bad[0]]}); clean the data or keep it as F32/F16/BF16")


def as_records(blocks: np.ndarray, block_dtype: np.dtype) -> np.ndarray:
    """(n_blocks, itemsize) uint8 -> (n_blocks,) structured records (a view, no copy)."""
    return np.ascontiguousarray(blocks).view(block_dtype).reshape(-1)


def records_to_bytes(records: np.ndarray) -> np.ndarray:
    """(n_blocks,) structured records -> (n_blocks, itemsize) uint8 (a view, no copy)."""
    return records.view(np.uint8).reshape(records.shape[0], records.dtype.itemsize)


def byte_block_decoder(name: str, type_size: int, decode: Callable[[np.ndarray], np.ndarray]):
    """A type's to_float: its byte blocks checked, then ``decode``d with inf/NaN scales passing through."""
    def to_float(blocks: np.ndarray) -> np.ndarray:
        blocks = check_byte_blocks(blocks, name, type_size)
        with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN fp16 scales decode to inf/NaN, as in C
            return decode(blocks)
    to_float.__name__ = decode.__name__
    return to_float


# -- block-parallel encoders -------------------------------------------------------------------
MIN_BLOCKS_PER_TASK = 64


def run_in_threads(kernel, blocks: np.ndarray, qw: np.ndarray, out: np.ndarray, *tables) -> None:
    """kernel(blocks, qw, *tables, out) over contiguous ranges of blocks in threads (a numba kernel compiled
    with nogil=True). Blocks are independent, so the split changes no byte. qw of one row (no importance
    weights) goes to every range as is."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    n = blocks.shape[0]
    n_tasks = max(1, min(os.cpu_count() or 1, n // MIN_BLOCKS_PER_TASK))
    if n_tasks == 1:
        kernel(blocks, qw, *tables, out)
        return
    bounds = [(t * n // n_tasks, (t + 1) * n // n_tasks) for t in range(n_tasks)]
    per_row = qw.shape[0] == n

    def task(lo_hi):
        lo, hi = lo_hi
        kernel(blocks[lo:hi], qw[lo:hi] if per_row else qw, *tables, out[lo:hi])
    with ThreadPoolExecutor(n_tasks) as pool:
        list(pool.map(task, bounds))
