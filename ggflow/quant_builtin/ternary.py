"""The ternary types TQ1_0 and TQ2_0 (BitNet b1.58 weights: every element is -d, 0 or +d).

256 elements per block and one fp16 scale ``d = max|x|``; each element is ``lroundf(x / d)`` in
{-1, 0, 1}, stored + 1 as a trit. TQ2_0 keeps each trit in 2 bits (66 bytes, 2.0625 bits per weight);
TQ1_0 packs five trits per byte as a base-3 fixed-point fraction (54 bytes, 1.6875 bits per weight),
read back as the top bits of ``byte * 3^n * 3``. Both codecs are ggml's quantize_row_tq*_ref and
dequantize_row_tq* to the byte and bit, vectorized over blocks. Layouts: docs/quantization.md.
"""
from __future__ import annotations

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin._blocks import (
    check_byte_blocks, check_float_blocks, fp16_to_fp32, fp32_to_fp16_bits, require_finite,
    round_half_away, safe_reciprocal)

QK_K = 256
_POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


def _trits(name: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 256) floats -> fp16 bits of d = max|x|, and (n, 256) trits ``lroundf(x * (1/d)) + 1``.

    A block so small that 1/d overflows makes x * id inf or NaN; lroundf then returns LONG_MIN on
    x86-64, and ``(int)(LONG_MIN + 1)`` is 1: the zero trit. Same here."""
    blocks = check_float_blocks(blocks, name, QK_K)
    require_finite(blocks, name)
    d = np.abs(blocks).max(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        v = blocks * safe_reciprocal(d)[:, None]
        trits = np.where(np.isfinite(v), round_half_away(np.where(np.isfinite(v), v, 0)) + 1, 1)
    return fp32_to_fp16_bits(d), trits.astype(np.uint8)


def _d_bytes(bits: np.ndarray) -> np.ndarray:
    return bits.astype("<u2").view(np.uint8).reshape(-1, 2)


def _scaled(trits: np.ndarray, d_bytes: np.ndarray) -> np.ndarray:
    """``(float)(trit - 1) * d`` per element."""
    d = fp16_to_fp32(d_bytes.copy().view("<f2"))
    return (trits.astype(np.int16) - 1).astype(np.float32) * d


# -- TQ2_0: qs[64] d:f16; byte 32h + m holds elements 128h + 32k + m at bits 2k ----------------------
def tq2_0_from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
    """quant_weights: accepted and unused, as ggml's quantize_* ignores them for this type."""
    d, trits = _trits("TQ2_0", blocks)
    q = trits.reshape(-1, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint8)[:, None]
    qs = (q[:, :, 0] | q[:, :, 1] | q[:, :, 2] | q[:, :, 3]).reshape(-1, 64)
    return np.concatenate([qs, _d_bytes(d)], axis=1)


def tq2_0_to_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_byte_blocks(blocks, "TQ2_0", 66)
    q = (blocks[:, 0:64].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    with np.errstate(invalid="ignore"):
        return _scaled(q.reshape(-1, QK_K), blocks[:, 64:66])


# -- TQ1_0: qs[48] qh[4] d:f16 ------------------------------------------------------------------------
# qs[0:32]: byte m holds elements m + 32n (n = 0..4, most significant trit first); qs[32:48]: byte m
# holds elements 160 + m + 16n; qh[j]: elements 240 + j + 4n (n = 0..3), then a zero trit.
def _pack5(trits: np.ndarray) -> np.ndarray:
    """(n, 5, m) trits, most significant first -> (n, m) bytes: ceil(value * 256 / 243)."""
    value = np.zeros(trits.shape[::2], np.uint16)
    for n in range(trits.shape[1]):          # 5 digits: a loop over digit positions, not elements
        value = value * 3 + trits[:, n]
    return ((value * 256 + 242) // 243).astype(np.uint8)


def tq1_0_from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
    """quant_weights: accepted and unused, as ggml's quantize_* ignores them for this type."""
    d, trits = _trits("TQ1_0", blocks)
    t = trits.astype(np.uint16)
    qs0 = _pack5(t[:, 0:160].reshape(-1, 5, 32))
    qs1 = _pack5(t[:, 160:240].reshape(-1, 5, 16))
    qh = _pack5(np.concatenate([t[:, 240:256].reshape(-1, 4, 4), np.zeros((t.shape[0], 1, 4), np.uint16)],
                               axis=1))
    return np.concatenate([qs0, qs1, qh, _d_bytes(d)], axis=1)


def _unpack5(packed: np.ndarray, digits: int) -> np.ndarray:
    """(n, m) bytes -> (n, digits * m) trits: digit n is ``((uint8)(byte * 3^n) * 3) >> 8``."""
    q = (packed[:, None, :] * _POW3[:digits, None]).astype(np.uint8)   # uint8 wrap, as C
    return ((q.astype(np.uint16) * 3) >> 8).reshape(packed.shape[0], -1)


def tq1_0_to_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_byte_blocks(blocks, "TQ1_0", 54)
    trits = np.concatenate([_unpack5(blocks[:, 0:32], 5), _unpack5(blocks[:, 32:48], 5),
                            _unpack5(blocks[:, 48:52], 4)], axis=1)
    with np.errstate(invalid="ignore"):
        return _scaled(trits, blocks[:, 52:54])


TQ1_0 = TypeTraits("TQ1_0", 34, QK_K, 54, tq1_0_to_float, tq1_0_from_float, "Q8_K")
TQ2_0 = TypeTraits("TQ2_0", 35, QK_K, 66, tq2_0_to_float, tq2_0_from_float, "Q8_K")


@hookimpl
def register_quant_types(register) -> None:
    register(TQ1_0)
    register(TQ2_0)
