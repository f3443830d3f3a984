"""Row-level quantize / dequantize through the type registry, shaped like ``gguf.quants``.

The last axis of a quantized array holds a row's bytes; the last axis of a float array holds a
row's elements. Everything else is batch. Any registered type works, third-party ones included.
"""
from __future__ import annotations

import numpy as np

from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import QuantizationError


def quantize(data: np.ndarray, type_name: "str | int | TypeTraits") -> np.ndarray:
    """float32 array [..., n] -> uint8 array [..., n // block_size * type_size]."""
    traits = type_traits(type_name)
    if traits.from_float is None:
        raise QuantizationError(f"{traits.name} has no quantizer (it can be read, not written)")
    data = np.ascontiguousarray(data, dtype=np.float32)
    if data.ndim == 0:
        raise QuantizationError("quantize needs at least one axis (a row)")
    n = data.shape[-1]
    row_bytes = traits.row_bytes(n)
    blocks = data.reshape(-1, traits.block_size)
    out = np.asarray(traits.from_float(blocks), dtype=np.uint8)
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
