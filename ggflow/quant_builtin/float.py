"""F32, F16 and BF16: the unblocked float types (block_size 1), converted exactly as ggml does.

F16 follows ggml's GGML_FP32_TO_FP16 (round to nearest even; NaN -> quiet 0x7E00 with sign).
BF16 follows ggml_compute_fp32_to_bf16: round to nearest even on the top 16 bits, a NaN keeps
its top 16 bits with the quiet bit forced, subnormals are kept (not flushed).
"""
from __future__ import annotations

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin._blocks import (
    check_byte_blocks, check_float_blocks, fp16_to_fp32, fp32_to_fp16_bits)


# -- F32 -------------------------------------------------------------------------------------
def f32_to_float(blocks: np.ndarray) -> np.ndarray:
    """Bytes -> float32. A view of the input (weights stay in the mmap), not a copy."""
    blocks = check_byte_blocks(blocks, "F32", 4)
    return blocks.view("<f4")


def f32_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_float_blocks(blocks, "F32", 1)
    return blocks.astype("<f4").view(np.uint8)


# -- F16 -------------------------------------------------------------------------------------
def f16_to_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_byte_blocks(blocks, "F16", 2)
    return fp16_to_fp32(blocks.view("<u2"))


def f16_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_float_blocks(blocks, "F16", 1)
    return fp32_to_fp16_bits(blocks).astype("<u2").view(np.uint8)


# -- BF16 ------------------------------------------------------------------------------------
def bf16_to_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_byte_blocks(blocks, "BF16", 2)
    return (blocks.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), as ggml_compute_fp32_to_bf16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(0x40)
    # Adding 0x7FFF plus the kept part's lowest bit rounds to nearest, ties to even; overflow
    # carries into the exponent, which is what makes values near FLT_MAX round to inf.
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def bf16_from_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_float_blocks(blocks, "BF16", 1)
    return fp32_to_bf16_bits(blocks).astype("<u2").view(np.uint8)


F32 = TypeTraits("F32", 0, 1, 4, f32_to_float, f32_from_float, "F32",
                 numpy_dtype=np.dtype("<f4"))
F16 = TypeTraits("F16", 1, 1, 2, f16_to_float, f16_from_float, "F16",
                 numpy_dtype=np.dtype("<f2"))
# numpy has no bfloat16; the raw bits are the element dtype.
BF16 = TypeTraits("BF16", 30, 1, 2, bf16_to_float, bf16_from_float, "BF16",
                  numpy_dtype=np.dtype("<u2"))


@hookimpl
def register_quant_types(register):
    for traits in (F32, F16, BF16):
        register(traits)
