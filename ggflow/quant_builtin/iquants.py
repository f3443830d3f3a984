"""The i-quants: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL and IQ4_XS.

Each decodes as ggml's ``dequantize_row_iq*`` does, bit for bit: per 32-element group (IQ4_NL: per
block) a scale from a 4-bit (IQ1: 3-bit) code times an fp16 super-scale, and the elements as entries
of a fixed table (``_iq_grids``: lattice points of 4 or 8 levels, sign patterns, the IQ4 non-linear
levels). Every index is masked to its table's size by the layout itself, so no byte pattern reads
outside a table. Decoders are vectorized numpy over all blocks; the same float32 products in C's
order, a sign applied as a multiplication by +-1 as C does. IQ4_NL and IQ4_XS also encode
(``_iq4_encoders``, ggml's quantize_row_iq4_*_ref), and so do IQ3_S and IQ3_XXS (``_iq3s_encoder``) and, given importance weights (which ggml
requires for them), IQ2_XXS, IQ2_XS (``_iq2_encoder``) and IQ1_S (``_iq1_encoder``), and IQ2_S with or
without; IQ1_M has no ``from_float`` here yet. Layouts: docs/quantization.md ("I-quants").
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin import _iq_grids as tables
from ggflow.quant_builtin._blocks import byte_block_decoder, fp16_to_fp32, run_in_threads

QK_K = 256
IQ1S_DELTA = np.float32(0.125)
_BITS8 = np.arange(8, dtype=np.uint8)
# float32 views of the tables: each entry's levels as floats (grids) or its 8 signs as +-1.0 (ksigns)
_GRID_IQ2XXS = tables.IQ2XXS_GRID.astype(np.float32)
_GRID_IQ2XS = tables.IQ2XS_GRID.astype(np.float32)
_GRID_IQ2S = tables.IQ2S_GRID.astype(np.float32)
_GRID_IQ3XXS = tables.IQ3XXS_GRID.astype(np.float32)
_GRID_IQ3S = tables.IQ3S_GRID.astype(np.float32)
_GRID_IQ1S = tables.IQ1S_GRID.astype(np.float32)
_KVALUES = tables.KVALUES_IQ4NL.astype(np.float32)


def _sign_bits(bits: np.ndarray) -> np.ndarray:
    """(...) bytes -> (..., 8) float32 +-1: bit j set means element j is negated."""
    return np.where((bits[..., None] >> _BITS8) & 1, np.float32(-1), np.float32(1))


_KSIGNS = _sign_bits(tables.KSIGNS_IQ2XS)           # (128, 8): ksigns_iq2xs expanded


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """(n, 1) float32 from the little-endian half at byte ``offset`` of each block."""
    return fp16_to_fp32(blocks[:, offset:offset + 2].copy().view("<f2"))


def _u16(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    return blocks[:, start:stop].copy().view("<u2")


def _u32(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    return blocks[:, start:stop].copy().view("<u4")


def _nibbles(b: np.ndarray) -> np.ndarray:
    """(n, m) bytes -> (n, 2m): low then high nibble of each byte, interleaved per byte."""
    return np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], -1)


def _half_scale(d: np.ndarray, code: np.ndarray, factor: float) -> np.ndarray:
    """``d * (0.5f + code) * factor`` in float32, as the IQ2/IQ3_XXS decoders compute a group scale."""
    return d * (np.float32(0.5) + code.astype(np.float32)) * np.float32(factor)


# -- decoders (validated (n, type_size) uint8 in, (n, 256) float32 out) --------------------------
def dequantize_iq2_xxs(blocks: np.ndarray) -> np.ndarray:
    """66 bytes: d, then per 32-group two u32: 4 grid bytes; 4 x 7-bit sign indices + 4-bit scale."""
    n = blocks.shape[0]
    words = _u32(blocks, 2, 66).reshape(n, 8, 2)
    db = _half_scale(_f16(blocks, 0), words[:, :, 1] >> 28, 0.25)            # (n, 8)
    grid = _GRID_IQ2XXS[blocks[:, 2:66].reshape(n, 8, 8)[:, :, :4]]         # (n, 8, 4, 8)
    signs = _KSIGNS[(words[:, :, 1, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127]
    return (db[:, :, None, None] * grid * signs).reshape(n, QK_K)


def dequantize_iq2_xs(blocks: np.ndarray) -> np.ndarray:
    """74 bytes: d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of two 4-bit scales."""
    n = blocks.shape[0]
    qs = _u16(blocks, 2, 66).reshape(n, 16, 2)                              # per 16 elements: 2 entries
    db = _half_scale(_f16(blocks, 0), _nibbles(blocks[:, 66:74]), 0.25)     # (n, 16)
    grid, signs = _GRID_IQ2XS[qs & 511], _KSIGNS[qs >> 9]                  # (n, 16, 2, 8)
    return (db[:, :, None, None] * grid * signs).reshape(n, QK_K)


def dequantize_iq2_s(blocks: np.ndarray) -> np.ndarray:
    """82 bytes: d, 32 grid low bytes, 32 sign bytes, 8 qh bytes (2 high bits per entry), 8 scale bytes."""
    n = blocks.shape[0]
    qh = blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)         # entry l of group g: qh[g] bits 2l
    index = blocks[:, 2:34].astype(np.uint16) | ((qh & 3).astype(np.uint16) << 8).reshape(n, 32)
    db = _half_scale(_f16(blocks, 0), _nibbles(blocks[:, 74:82]), 0.25)     # (n, 16)
    grid = _GRID_IQ2S[index].reshape(n, 16, 2, 8)
    signs = _sign_bits(blocks[:, 34:66]).reshape(n, 16, 2, 8)
    return (db[:, :, None, None] * grid * signs).reshape(n, QK_K)


def dequantize_iq3_xxs(blocks: np.ndarray) -> np.ndarray:
    """98 bytes: d, 64 grid bytes (4 levels each), then per 32-group a u32 of 4 sign indices + scale."""
    n = blocks.shape[0]
    aux = _u32(blocks, 66, 98)                                               # (n, 8)
    db = _half_scale(_f16(blocks, 0), aux >> 28, 0.5)
    grid = _GRID_IQ3XXS[blocks[:, 2:66]].reshape(n, 8, 4, 8)                # 2 entries of 4 per sign byte
    signs = _KSIGNS[(aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127]
    return (db[:, :, None, None] * grid * signs).reshape(n, QK_K)


def dequantize_iq3_s(blocks: np.ndarray) -> np.ndarray:
    """110 bytes: d, 64 grid low bytes, 8 qh bytes (bit k: 9th bit of entry k of group g),
    32 sign bytes, 4 bytes of two 4-bit scales; group scale d * (1 + 2*code)."""
    n = blocks.shape[0]
    high = ((blocks[:, 66:74, None] >> _BITS8) & 1).astype(np.uint16).reshape(n, 64)
    index = blocks[:, 2:66].astype(np.uint16) | (high << 8)
    codes = _nibbles(blocks[:, 106:110]).astype(np.int32)                  # (n, 8)
    db = _f16(blocks, 0) * (1 + 2 * codes).astype(np.float32)
    grid = _GRID_IQ3S[index].reshape(n, 8, 32)
    signs = _sign_bits(blocks[:, 74:106]).reshape(n, 8, 32)
    return (db[:, :, None] * grid * signs).reshape(n, QK_K)


def dequantize_iq1_s(blocks: np.ndarray) -> np.ndarray:
    """50 bytes: d, 32 grid low bytes, 8 u16 qh: 4 x 3 high index bits, 3-bit scale, delta sign."""
    n = blocks.shape[0]
    qh = _u16(blocks, 34, 50)                                                # (n, 8)
    dl = _f16(blocks, 0) * (2 * ((qh >> 12) & 7).astype(np.int32) + 1).astype(np.float32)
    delta = np.where(qh & 0x8000, -IQ1S_DELTA, IQ1S_DELTA)
    high = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    index = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << 8)
    grid = _GRID_IQ1S[index].reshape(n, 8, 32)
    return (dl[:, :, None] * (grid + delta[:, :, None])).reshape(n, QK_K)


def dequantize_iq1_m(blocks: np.ndarray) -> np.ndarray:
    """56 bytes: 32 grid low bytes, 16 qh bytes (per entry 3 high bits + delta sign, a nibble each),
    4 u16 scales: 3-bit codes per 16 elements, the fp16 super-scale in their top nibbles."""
    n = blocks.shape[0]
    sc = _u16(blocks, 48, 56)                                                # (n, 4)
    d_bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    d = fp16_to_fp32(d_bits)[:, None]
    codes = ((sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16)
    dl = d * (2 * codes.astype(np.int32) + 1).astype(np.float32)             # (n, 16)
    qh = _nibbles(blocks[:, 32:48])                                          # (n, 32): one per entry
    index = blocks[:, 0:32].astype(np.uint16) | ((qh & 7).astype(np.uint16) << 8)
    delta = np.where(qh & 8, -IQ1S_DELTA, IQ1S_DELTA).reshape(n, 16, 2, 1)
    grid = _GRID_IQ1S[index].reshape(n, 16, 2, 8)
    return (dl[:, :, None, None] * (grid + delta)).reshape(n, QK_K)


def dequantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    """18 bytes, 32 elements: d, 16 bytes of table indices (element j low nibble, j + 16 high)."""
    qs = blocks[:, 2:18]
    return _f16(blocks, 0) * _KVALUES[np.concatenate([qs & 15, qs >> 4], axis=1)]


def dequantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    """136 bytes: d, u16 scales_h (2 high bits per group), 4 bytes scales_l (4 low bits per group),
    then per 32-group 16 bytes of indices as IQ4_NL; group scale d * (code - 32)."""
    n = blocks.shape[0]
    high = (_u16(blocks, 2, 4) >> np.arange(0, 16, 2, dtype=np.uint16)) & 3  # (n, 8)
    codes = _nibbles(blocks[:, 4:8]).astype(np.int32) | (high.astype(np.int32) << 4)
    dl = _f16(blocks, 0) * (codes - 32).astype(np.float32)                  # (n, 8)
    qs = blocks[:, 8:136].reshape(n, 8, 16)
    values = _KVALUES[np.concatenate([qs & 15, qs >> 4], axis=2)]           # (n, 8, 32)
    return (dl[:, :, None] * values).reshape(n, QK_K)


# -- traits ----------------------------------------------------------------------------------


def _traits(name: str, type_id: int, block_size: int, type_size: int, decode, vec_dot_type: str,
            encode=None) -> TypeTraits:
    return TypeTraits(name=name, type_id=type_id, block_size=block_size, type_size=type_size,
                      to_float=byte_block_decoder(name, type_size, decode), from_float=encode,
                      vec_dot_type=vec_dot_type)


def _iq3_encoder(name: str, grid_size: int, type_size: int, module: str = "_iq3s_encoder") -> Callable[..., np.ndarray]:
    """ggml's quantize_iq3_s / quantize_iq3_xxs / quantize_iq2_s (with quant_weights: the imatrix path),
    byte for byte: the encoders whose weights are optional."""
    def from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
        import importlib

        from ggflow.errors import QuantizationError
        enc = importlib.import_module(f"ggflow.quant_builtin.{module}")   # numba compiles on first use
        from ggflow.quant_builtin._blocks import check_float_blocks, require_finite
        blocks = check_float_blocks(blocks, name, QK_K)
        require_finite(blocks, name)
        if quant_weights is None:
            qw, has_qw = np.zeros((1, QK_K), np.float32), False
        else:
            qw, has_qw = np.ascontiguousarray(quant_weights, dtype=np.float32), True
            if qw.shape != blocks.shape:
                raise QuantizationError(f"{name}: importance weights of shape {qw.shape} for blocks of shape "
                                        f"{blocks.shape}")
        out = np.zeros((blocks.shape[0], type_size), np.uint8)
        kernel = getattr(enc, f"quantize_{name.lower()}")
        run_in_threads(lambda b, w, *rest: kernel(b, w, has_qw, *rest), blocks, qw, out, *enc.tables(grid_size))
        return out
    from_float.__name__ = f"quantize_{name.lower()}"
    return from_float


def _iq2_encoder(name: str, grid_size: int, type_size: int, module: str = "_iq2_encoder") -> Callable[..., np.ndarray]:
    """ggml's quantize_iq2_xxs / _xs, quantize_iq1_s, byte for byte; importance weights required, as in ggml."""
    def from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
        import importlib

        from ggflow.errors import QuantizationError
        from ggflow.quant_builtin import _iq2_encoder as tabs   # numba compiles on first use, not at plugin load
        enc = importlib.import_module(f"ggflow.quant_builtin.{module}")
        from ggflow.quant_builtin._blocks import check_float_blocks, require_finite
        blocks = check_float_blocks(blocks, name, QK_K)
        require_finite(blocks, name)
        if quant_weights is None:
            raise QuantizationError(f"{name} needs importance weights (ggml's quantizer requires them): give an "
                                    "imatrix (ggflow quantize --imatrix FILE; ggflow imatrix computes one)")
        qw = np.ascontiguousarray(quant_weights, dtype=np.float32)
        if qw.shape != blocks.shape:
            raise QuantizationError(f"{name}: importance weights of shape {qw.shape} for blocks of shape "
                                    f"{blocks.shape}")
        out = np.zeros((blocks.shape[0], type_size), np.uint8)
        run_in_threads(getattr(enc, f"quantize_{name.lower()}"), blocks, qw, out, *tabs.tables(grid_size))
        return out
    from_float.__name__ = f"quantize_{name.lower()}"
    return from_float


def _encoder(name: str) -> Callable[[np.ndarray], np.ndarray]:
    def from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
        from ggflow.quant_builtin import _iq4_encoders  # numba compiles on first use, not at plugin load
        return getattr(_iq4_encoders, f"quantize_{name.lower()}")(blocks, quant_weights)
    from_float.__name__ = f"quantize_{name.lower()}"
    return from_float


IQ2_XXS = _traits("IQ2_XXS", 16, QK_K, 66, dequantize_iq2_xxs, "Q8_K", _iq2_encoder("IQ2_XXS", 256, 66))
IQ2_XS = _traits("IQ2_XS", 17, QK_K, 74, dequantize_iq2_xs, "Q8_K", _iq2_encoder("IQ2_XS", 512, 74))
IQ3_XXS = _traits("IQ3_XXS", 18, QK_K, 98, dequantize_iq3_xxs, "Q8_K", _iq3_encoder("IQ3_XXS", 256, 98))
IQ1_S = _traits("IQ1_S", 19, QK_K, 50, dequantize_iq1_s, "Q8_K", _iq2_encoder("IQ1_S", 2048, 50, "_iq1_encoder"))
IQ4_NL = _traits("IQ4_NL", 20, 32, 18, dequantize_iq4_nl, "Q8_0", _encoder("IQ4_NL"))
IQ3_S = _traits("IQ3_S", 21, QK_K, 110, dequantize_iq3_s, "Q8_K", _iq3_encoder("IQ3_S", 512, 110))
IQ2_S = _traits("IQ2_S", 22, QK_K, 82, dequantize_iq2_s, "Q8_K", _iq3_encoder("IQ2_S", 1024, 82, "_iq2_encoder"))
IQ4_XS = _traits("IQ4_XS", 23, QK_K, 136, dequantize_iq4_xs, "Q8_K", _encoder("IQ4_XS"))
IQ1_M = _traits("IQ1_M", 29, QK_K, 56, dequantize_iq1_m, "Q8_K")
I_QUANTS = (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M)


@hookimpl
def register_quant_types(register) -> None:
    for traits in I_QUANTS:
        register(traits)
