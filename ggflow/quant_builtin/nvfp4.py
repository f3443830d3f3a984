"""NVFP4: NVIDIA's 4-bit float blocks, as ggml stores them (block_nvfp4).

64 elements in 36 bytes (4.5 bits per weight): four UE4M3 scales (unsigned 8-bit float, 4 exponent
bits biased by 7, 3 mantissa bits; 0x00 and 0x7F read as 0, bit 7 is ignored), one per 16 elements,
then 32 bytes of E2M1 codes (sub-block s: byte 8s + j holds element j in its low nibble and j + 8
in its high one). An element is ``kvalues_mxfp4[code] * ue4m3(scale)``, where the table holds the
E2M1 values doubled and the scale decoder halves. Decoding is ggml's dequantize_row_nvfp4; there is
no encoder here (ggml's is used by nobody's mixes; a later addition). Activations dot as Q8_0.
"""
from __future__ import annotations

import numpy as np

from ggflow.core.types import TypeTraits
from ggflow.plugins.hookspecs import hookimpl
from ggflow.quant_builtin._blocks import check_byte_blocks

QK = 64
KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _ue4m3_table() -> np.ndarray:
    """All 256 scale bytes -> float32, ggml_ue4m3_to_fp32: ldexpf(man, -9) or ldexpf(1 + man/8, exp - 7),
    times 0.5. Every value is exact in float32, so the table is the function."""
    x = np.arange(256)
    exp, man = (x >> 3) & 15, (x & 7).astype(np.float32)
    raw = np.where(exp == 0, np.ldexp(man, -9), np.ldexp(np.float32(1) + man / np.float32(8), exp - 7))
    return np.where((x == 0) | (x == 0x7F), np.float32(0), raw.astype(np.float32) * np.float32(0.5)
                    ).astype(np.float32)


UE4M3 = _ue4m3_table()


def nvfp4_to_float(blocks: np.ndarray) -> np.ndarray:
    blocks = check_byte_blocks(blocks, "NVFP4", 36)
    n = blocks.shape[0]
    d = UE4M3[blocks[:, 0:4]]                                        # (n, 4)
    qs = blocks[:, 4:36].reshape(n, 4, 8)
    values = KVALUES_FP4[np.concatenate([qs & 15, qs >> 4], axis=2)]  # (n, 4, 16)
    return (values * d[:, :, None]).reshape(n, QK)


NVFP4 = TypeTraits("NVFP4", 40, QK, 36, nvfp4_to_float, None, "Q8_0")


@hookimpl
def register_quant_types(register) -> None:
    register(NVFP4)
