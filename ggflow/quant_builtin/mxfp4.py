"""MXFP4 (OCP microscaling FP4, gpt-oss's experts): 32 elements of 4-bit E2M1 sharing one E8M0 scale.

Layout (17 bytes):  e:u8  qs:16 bytes      x = kvalue[q] * 2^(e - 128)
kvalues are E2M1's values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives -> 0, 1, 2, 3, 4, 6, 8, 12),
so the scale is half the E8M0 value (ggml_e8m0_to_fp32_half); e = 0 and 1 are subnormal scales, and e = 255,
which E8M0 reserves for NaN, decodes as ggml decodes it: 2^127 (so 12 * 2^127 is inf). Element j sits in
byte j % 16, low nibble if j < 16.

``mxfp4_to_float`` is ggml's dequantize_row_mxfp4 (and gguf-py's) bit for bit; ``mxfp4_from_float`` its
quantize_row_mxfp4_ref byte for byte: e = floorf(log2f(amax)) - 2 + 127 cast to uint8 as x86-64 casts
(a block whose largest |x| is below 2^-125 wraps, as in ggml), then each element's nearest level, the
first of equal errors. log2f is taken as the correctly rounded log2 (float64, rounded to float32): what
glibc's log2f gives on the blocks of tests/data/mxfp4_ggml.npz, including maxima one ulp either side of
powers of two, where the floor depends on that rounding.
"""
from __future__ import annotations

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin._blocks import (
    as_records, c_float_to_uint8, check_byte_blocks, check_float_blocks, pack_nibbles, records_to_bytes,
    require_finite, unpack_nibbles)

QK = 32
MXFP4_BLOCK = np.dtype([("e", "u1"), ("qs", "u1", QK // 2)])
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_LEVELS = KVALUES.astype(np.float32)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """Half the E8M0 value 2^(e - 127), as ggml builds its bits (e < 2: subnormal)."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def mxfp4_to_float(blocks: np.ndarray) -> np.ndarray:
    rec = as_records(check_byte_blocks(blocks, "MXFP4", MXFP4_BLOCK.itemsize), MXFP4_BLOCK)
    d = e8m0_to_fp32_half(rec["e"])[:, None]
    with np.errstate(over="ignore"):                  # e = 255: 12 * 2^127 is inf, as in ggml
        return _LEVELS[unpack_nibbles(rec["qs"])] * d


def mxfp4_from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
    """quant_weights: accepted and unused, as ggml's quantize_* ignores them for this type."""
    blocks = check_float_blocks(blocks, "MXFP4", QK)
    require_finite(blocks, "MXFP4")
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        log2 = np.log2(amax.astype(np.float64)).astype(np.float32)     # log2f, correctly rounded
    exponent = np.floor(np.where(amax > 0, log2, 0)) - np.float32(2) + np.float32(127)
    e = np.where(amax > 0, c_float_to_uint8(exponent), np.uint8(0)).astype(np.uint8)
    d = e8m0_to_fp32_half(e)
    with np.errstate(over="ignore"):                  # 12 * d past float32 for maxima near 2^128, as in ggml
        err = np.abs(_LEVELS[None, None, :] * d[:, None, None] - blocks[:, :, None])   # (n, 32, 16)
    rec = np.zeros(len(blocks), MXFP4_BLOCK)
    rec["e"], rec["qs"] = e, pack_nibbles(np.argmin(err, axis=-1))   # argmin: the first of equal errors
    return records_to_bytes(rec)


MXFP4 = TypeTraits("MXFP4", 39, QK, MXFP4_BLOCK.itemsize, mxfp4_to_float, mxfp4_from_float, "Q8_0", MXFP4_BLOCK)


@hookimpl
def register_quant_types(register):
    register(MXFP4)
