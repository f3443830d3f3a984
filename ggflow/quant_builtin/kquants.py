"""The K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K, bit-exact with ggml.

Each format packs a 256-element super-block (QK_K) with per-sub-block scales that are
themselves quantized against one or two fp16 super-block scales. Q8_K is the activation
format the others are dotted with (their ``vec_dot_type``).

Decoders are vectorized numpy over all blocks; encoders are ggml's ``quantize_row_q*_K_ref``
in numba (``_kquant_encoders``), including its scale searches, so the bytes match ggml's.
Block layouts and the exactness details are in docs/quantization.md ("K-quants").
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.errors import QuantizationError
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin._blocks import byte_block_decoder, check_float_blocks, fp16_to_fp32, require_finite

QK_K = 256
F16 = "<f2"
# Below this many blocks per thread, waking threads costs more than it saves (Q8_K: ~1 us a block).
MIN_BLOCKS_PER_THREAD = 32

BLOCK_Q2_K = np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", F16), ("dmin", F16)])
BLOCK_Q3_K = np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", F16)])
BLOCK_Q4_K = np.dtype([("d", F16), ("dmin", F16), ("scales", "u1", 12), ("qs", "u1", 128)])
BLOCK_Q5_K = np.dtype([("d", F16), ("dmin", F16), ("scales", "u1", 12), ("qh", "u1", 32),
                       ("qs", "u1", 128)])
BLOCK_Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", F16)])
BLOCK_Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])


# -- decoding helpers (all (n_blocks, ...) arrays) ---------------------------------------------
def _fp16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """(n,) float32 from the little-endian half at byte ``offset`` of each block."""
    return fp16_to_fp32(blocks[:, offset:offset + 2].copy().view(F16)[:, 0])


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes -> (n, 256) levels 0..3; byte 32*h + l, bits 2k hold element 128*h + 32*k + l."""
    shifts = np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, QK_K)


def _unpack_scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) bytes -> (n, 8) 6-bit scales and (n, 8) 6-bit mins (see the docs' diagram)."""
    lo, mid, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales, mins


def _unpack_q3_scales(packed: np.ndarray) -> np.ndarray:
    """(n, 12) bytes -> (n, 16) signed scales: low nibbles in bytes 0..7 (j and j+8 share a
    byte), the top 2 bits of scale j at bits 2*(j//4) of byte 8 + j%4; stored offset by 32."""
    low = np.concatenate([packed[:, 0:8] & 0xF, packed[:, 0:8] >> 4], axis=1)
    j = np.arange(16)
    high = (packed[:, 8 + j % 4] >> (2 * (j // 4)).astype(np.uint8)) & 3
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


# -- decoders: ggml's dequantize_row_q*_K, the same float32 operations in the same order ----------
# (validated (n_blocks, type_size) uint8 in, (n_blocks, 256) float32 out)
def dequantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin = _fp16(blocks, 80), _fp16(blocks, 82)
    sc = blocks[:, 0:16]
    dl = d[:, None] * _f32(sc & 0xF)                       # (n, 16)
    ml = dmin[:, None] * _f32(sc >> 4)
    q = _f32(_unpack_2bit(blocks[:, 16:80])).reshape(-1, 16, 16)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1, QK_K)


def dequantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    d = _fp16(blocks, 108)
    dl = d[:, None] * _f32(_unpack_q3_scales(blocks[:, 96:108]))  # (n, 16)
    bit = np.arange(8, dtype=np.uint8)[None, :, None]
    high = ((blocks[:, None, 0:32] >> bit) & 1).reshape(-1, QK_K)  # element e: byte e%32, bit e//32
    q = _unpack_2bit(blocks[:, 32:96]).astype(np.int8) - np.where(high == 1, 0, 4).astype(np.int8)
    return (dl[:, :, None] * _f32(q).reshape(-1, 16, 16)).reshape(-1, QK_K)


def _dequantize_k4(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: y = (d*scale) * q - dmin*min per 32-element sub-block; q is (n, 8, 32)."""
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    scales, mins = _unpack_scale_min_k4(blocks[:, 4:16])
    d1 = d[:, None] * _f32(scales)
    m1 = dmin[:, None] * _f32(mins)
    return (d1[:, :, None] * _f32(q) - m1[:, :, None]).reshape(-1, QK_K)


def _nibbles_by_subblock(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 8, 32): 32-byte run k holds sub-block 2k (low) and 2k+1 (high)."""
    runs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([runs & 0xF, runs >> 4], axis=2).reshape(-1, 8, 32)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    return _dequantize_k4(blocks, _nibbles_by_subblock(blocks[:, 16:144]))


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    bit = np.arange(8, dtype=np.uint8)[None, :, None]
    fifth = (blocks[:, None, 16:48] >> bit) & 1            # sub-block s: bit s of qh[l]
    return _dequantize_k4(blocks, _nibbles_by_subblock(blocks[:, 48:176]) + (fifth << 4))


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    d = _fp16(blocks, 208)
    ql = blocks[:, 0:128].reshape(-1, 2, 2, 1, 32)          # half, run, -, l
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)           # half, -, l
    low = np.concatenate([ql & 0xF, ql >> 4], axis=3)       # half, run, nibble, l
    low = low.transpose(0, 1, 3, 2, 4).reshape(-1, 2, 4, 32)  # quarter k = nibble*2 + run
    shifts = np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    high = (qh >> shifts) & 3                               # quarter k: bits 2k of qh[l]
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    dl = d[:, None] * _f32(blocks[:, 192:208].view(np.int8))  # (n, 16)
    return (dl[:, :, None] * _f32(q).reshape(-1, 16, 16)).reshape(-1, QK_K)


def dequantize_q8_k(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, 0:4].copy().view("<f4")
    return d * _f32(blocks[:, 4:260].view(np.int8))


# -- encoders and traits ------------------------------------------------------------------------
def _encoder(name: str, type_size: int) -> Callable[[np.ndarray], np.ndarray]:
    def from_float(blocks: np.ndarray) -> np.ndarray:
        blocks = check_float_blocks(blocks, name, QK_K)
        require_finite(blocks, name)
        out = np.empty((blocks.shape[0], type_size), np.uint8)
        from numba import get_num_threads  # numba loads (and compiles) on first use, not at plugin load
        from ggflow.quant_builtin import _kquant_encoders as encoders
        n_blocks = blocks.shape[0]
        n_chunks = min(get_num_threads(), n_blocks // MIN_BLOCKS_PER_THREAD)
        if n_chunks > 1:
            getattr(encoders, f"quantize_{name.lower()}_parallel")(blocks, out, n_chunks)
        else:
            getattr(encoders, f"quantize_{name.lower()}")(blocks, out, 0, n_blocks)
        return out
    from_float.__name__ = f"quantize_{name.lower()}"
    return from_float


def _weighted_encoder(name: str, type_size: int) -> Callable[..., np.ndarray]:
    """from_float that also takes importance weights (ggml's quantize_row_<type>_impl; _kquant_weighted)."""
    plain = _encoder(name, type_size)

    def from_float(blocks: np.ndarray, quant_weights: np.ndarray | None = None) -> np.ndarray:
        if quant_weights is None:
            return plain(blocks)
        blocks = check_float_blocks(blocks, name, QK_K)
        require_finite(blocks, name)
        qw = np.ascontiguousarray(quant_weights, dtype=np.float32)
        if qw.shape != blocks.shape:
            raise QuantizationError(f"{name}: importance weights of shape {qw.shape} for blocks of shape "
                                    f"{blocks.shape}; they must match element for element")
        out = np.zeros((blocks.shape[0], type_size), np.uint8)
        from ggflow.quant_builtin import _kquant_weighted
        getattr(_kquant_weighted, f"quantize_{name.lower()}_w")(blocks, qw, out)
        return out
    from_float.__name__ = f"quantize_{name.lower()}"
    return from_float


_WEIGHTED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _traits(name: str, type_id: int, block_dtype: np.dtype, decode) -> TypeTraits:
    size = block_dtype.itemsize
    return TypeTraits(name=name, type_id=type_id, block_size=QK_K, type_size=size,
                      to_float=byte_block_decoder(name, size, decode),
                      from_float=(_weighted_encoder if name in _WEIGHTED else _encoder)(name, size),
                      vec_dot_type="Q8_K", block_dtype=block_dtype)


Q2_K = _traits("Q2_K", 10, BLOCK_Q2_K, dequantize_q2_k)
Q3_K = _traits("Q3_K", 11, BLOCK_Q3_K, dequantize_q3_k)
Q4_K = _traits("Q4_K", 12, BLOCK_Q4_K, dequantize_q4_k)
Q5_K = _traits("Q5_K", 13, BLOCK_Q5_K, dequantize_q5_k)
Q6_K = _traits("Q6_K", 14, BLOCK_Q6_K, dequantize_q6_k)
Q8_K = _traits("Q8_K", 15, BLOCK_Q8_K, dequantize_q8_k)
K_QUANTS = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)


@hookimpl
def register_quant_types(register) -> None:
    for traits in K_QUANTS:
        register(traits)
