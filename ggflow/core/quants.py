"""Row-level quantize / dequantize through the type registry, shaped like ``gguf.quants``.

The last axis of a quantized array holds a row's bytes; the last axis of a float array holds a
row's elements. Everything else is batch. Any registered type works, third-party ones included.
"""
from __future__ import annotations

import numpy as np

import inspect
from functools import lru_cache

from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import QuantizationError


@lru_cache(maxsize=None)
def _encoder_params(from_float) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(from_float).parameters)
    except (TypeError, ValueError):
        return frozenset()


def _encoder_takes_weights(from_float) -> bool:
    return "quant_weights" in _encoder_params(from_float)


def takes_importance(type_name: "str | int | TypeTraits") -> bool:
    """Whether the type's encoder takes importance weights: a ``from_float(blocks, quant_weights=None)``
    whose quant_weights, when given, are (n_blocks, block_size) float32 (ggml's quant_weights per element).
    An encoder that also has an ``n_per_row`` parameter is told the row length (ggml's legacy types weigh
    by the row's mean square)."""
    traits = type_traits(type_name)
    return traits.from_float is not None and _encoder_takes_weights(traits.from_float)


def quantize(data: np.ndarray, type_name: "str | int | TypeTraits", quant_weights: np.ndarray | None = None) -> np.ndarray:
    """float32 array [..., n] -> uint8 array [..., n // block_size * type_size].

    quant_weights: importance weights, one per column (n,), the same for every row (an imatrix's
    entry); the encoder must take them (``takes_importance``), else QuantizationError."""
    traits = type_traits(type_name)
    if traits.from_float is None:
        raise QuantizationError(f"{traits.name} has no quantizer (it can be read, not written)")
    data = np.ascontiguousarray(data, dtype=np.float32)
    if data.ndim == 0:
        raise QuantizationError("quantize needs at least one axis (a row)")
    n = data.shape[-1]
    row_bytes = traits.row_bytes(n)
    blocks = data.reshape(-1, traits.block_size)
    if quant_weights is None:
        out = np.asarray(traits.from_float(blocks), dtype=np.uint8)
    else:
        if not takes_importance(traits):
            raise QuantizationError(f"{traits.name}'s quantizer takes no importance weights")
        qw = np.ascontiguousarray(quant_weights, dtype=np.float32).reshape(-1)
        if qw.size != n:
            raise QuantizationError(f"{qw.size} importance weights for rows of {n} elements")
        qw = np.broadcast_to(qw.reshape(1, -1), (blocks.size // n, n)).reshape(-1, traits.block_size)
        extra = {"n_per_row": n} if "n_per_row" in _encoder_params(traits.from_float) else {}
        out = np.asarray(traits.from_float(blocks, quant_weights=qw, **extra), dtype=np.uint8)
    return out.reshape(*data.shape[:-1], row_bytes)


def dequantize(data: np.ndarray, type_name: "str | int | TypeTraits") -> np.ndarray:
    """uint8 array [..., row_bytes] -> float32 array [..., row_bytes // type_size * block_size]."""
    traits = type_traits(type_name)
    data = np.ascontiguousarray(data)
    if data.dtype != np.uint8:
        data = data.view(np.uint8)
    if data.ndim == 0 or data.shape[-1] % traits.type_size:
        raise QuantizationError(
            f"{traits.name}: rows of {data.shape[-1] if data.ndim else 0} bytes are not a whole number "
            f"of {traits.type_size}-byte blocks")
    n = data.shape[-1] // traits.type_size * traits.block_size
    blocks = data.reshape(-1, traits.type_size)
    out = np.asarray(traits.to_float(blocks), dtype=np.float32)
    return out.reshape(*data.shape[:-1], n)
