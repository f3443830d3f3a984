"""The i-quant, ternary and NVFP4 types against references that are not ggflow's.

- Decoders: bit for bit with gguf-py's numpy dequantizers (gguf.quants, an independent implementation)
  on random bytes, which cover every grid index, sign pattern and scale code, and on scale fields forced
  to inf, NaN, subnormals and zero. Compared as uint32, so NaN payloads and signed zeros count.
- Encoders (IQ4_NL, IQ4_XS, TQ1_0, TQ2_0): byte for byte with ggml's own quantizers on the golden rows
  (tests/data/quant_iq_ggml_seed1.npz, see tests/data/README.md), with and without importance weights,
  and the golden bytes decode to what ggml's dequantize_row_* returned.
- The lookup tables (generated from ggml-common.h) equal gguf-py's copies.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import ggflow
from ggflow.core.types import type_traits
from ggflow.errors import QuantizationError
from ggflow.quant_builtin import _iq4_encoders as iq4
from ggflow.quant_builtin import _iq_grids as grids

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "quant_iq_ggml_seed1.npz"
GOLDEN_INPUT = REPO.parent / "shared" / "golden" / "quant_ggml_seed1.npz"
TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
         "TQ1_0", "TQ2_0", "NVFP4")
ENCODED = ("IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0")
ENCODED_ELSEWHERE = ("IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S")   # its golden bytes are in tests/test_quant_weighted.py
# byte offset of the fp16 super-scale d in each block (IQ1_M spreads it over its scales' top nibbles)
D_OFFSET = {"IQ1_S": 0, "IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ4_NL": 0,
            "IQ4_XS": 0, "TQ1_0": 52, "TQ2_0": 64}


def gguf_decode(q: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gq.dequantize(q.reshape(-1), gguf.GGMLQuantizationType[name]).astype(np.float32).reshape(len(q), -1)


def assert_bits_equal(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    bad = np.flatnonzero(ours.view(np.uint32) != ref.view(np.uint32))
    assert bad.size == 0, f"{bad.size} values differ, first at {bad[0]}: {ours.reshape(-1)[bad[0]]} vs {ref.reshape(-1)[bad[0]]}"


@pytest.mark.parametrize("name", TYPES)
def test_traits_match_gguf_constants(name):
    t = type_traits(name)
    qtype = gguf.GGMLQuantizationType[name]
    assert t.type_id == int(qtype) and (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[qtype]
    assert (t.from_float is not None) == (name in ENCODED + ENCODED_ELSEWHERE)


@pytest.mark.parametrize("name", TYPES)
def test_decoder_is_gguf_py_s_on_random_blocks(name):
    t = type_traits(name)
    q = np.random.default_rng(hash(name) % 2**32).integers(0, 256, (4000, t.type_size), dtype=np.uint8)
    assert_bits_equal(ggflow.dequantize(q, name).reshape(len(q), -1), gguf_decode(q, name))


SPECIAL_HALVES = np.array([0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x0001, 0x03FF, 0x8001, 0x0000, 0x8000,
                           0x7BFF, 0x0400], np.uint16)   # +-inf, NaNs, subnormals, zeros, max, min normal


@pytest.mark.parametrize("name", [n for n in TYPES if n in D_OFFSET or n == "IQ1_M"])
def test_decoder_is_gguf_py_s_for_inf_nan_and_subnormal_scales(name):
    t = type_traits(name)
    rng = np.random.default_rng(7)
    q = rng.integers(0, 256, (len(SPECIAL_HALVES) * 50, t.type_size), dtype=np.uint8)
    halves = np.repeat(SPECIAL_HALVES, 50)
    if name == "IQ1_M":   # d's nibbles sit in the top 4 bits of the four u16 scales (bytes 48..55)
        sc = q[:, 48:56].copy().view("<u2")
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((halves >> (4 * k)) & 0xF) << 12)
        q[:, 48:56] = sc.view(np.uint8)
    else:
        q[:, D_OFFSET[name]:D_OFFSET[name] + 2] = halves.astype("<u2").view(np.uint8).reshape(-1, 2)
    ours = ggflow.dequantize(q, name).reshape(len(q), -1)
    assert_bits_equal(ours, gguf_decode(q, name))
    assert np.isnan(ours).any() and np.isinf(ours).any()   # the cases were reached


def test_nvfp4_every_scale_byte_is_gguf_py_s():
    q = np.random.default_rng(3).integers(0, 256, (256, 36), dtype=np.uint8)
    q[:, 0:4] = np.arange(256, dtype=np.uint8)[:, None]   # every UE4M3 byte, 0x7F and bit 7 included
    assert_bits_equal(ggflow.dequantize(q, "NVFP4").reshape(256, 64), gguf_decode(q, "NVFP4"))


def test_grids_are_gguf_py_s():
    """The tables generated from ggml-common.h equal gguf-py's (independently packed) grids."""
    pairs = {"IQ2_XXS": grids.IQ2XXS_GRID, "IQ2_XS": grids.IQ2XS_GRID, "IQ2_S": grids.IQ2S_GRID,
             "IQ3_XXS": grids.IQ3XXS_GRID, "IQ3_S": grids.IQ3S_GRID, "IQ1_S": grids.IQ1S_GRID}
    for name, ours in pairs.items():
        cls = gq._type_traits[gguf.GGMLQuantizationType[name]]
        cls.init_grid()
        np.testing.assert_array_equal(cls.grid.reshape(ours.shape), ours.astype(np.float32), err_msg=name)
    np.testing.assert_array_equal(np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8), grids.KSIGNS_IQ2XS)
    np.testing.assert_array_equal(np.array(gq.IQ4_NL.kvalues, np.int8), grids.KVALUES_IQ4NL)


def test_decoders_reject_bad_input():
    with pytest.raises(QuantizationError, match="IQ2_XXS"):
        type_traits("IQ2_XXS").to_float(np.zeros((2, 65), np.uint8))
    with pytest.raises(QuantizationError, match="uint8"):
        type_traits("TQ1_0").to_float(np.zeros((2, 54), np.int16))
    with pytest.raises(QuantizationError, match="66-byte blocks"):
        ggflow.dequantize(np.zeros(67, np.uint8), "IQ2_XXS")


# -- encoders against ggml's bytes ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def golden():
    if not GOLDEN_INPUT.exists():
        pytest.skip(f"{GOLDEN_INPUT} is absent (the shared test data is not beside the repo)")
    return np.load(GOLDEN_INPUT)["input"], dict(np.load(GOLDEN))


def _blocks_differing(a: np.ndarray, b: np.ndarray, type_size: int) -> np.ndarray:
    return np.flatnonzero((a.reshape(-1, type_size) != b.reshape(-1, type_size)).any(axis=1))


@pytest.mark.parametrize("name", ENCODED)
def test_quantize_writes_ggml_s_bytes(golden, name):
    """ggflow.quantize = what llama-quantize writes without an imatrix (ggml_quantize_chunk: quantize_iq4_nl
    with 7 tries for IQ4_NL; quantize_row_*_ref for the others)."""
    x, g = golden
    want = g[f"{name}.chunk"] if name == "IQ4_NL" else g[f"{name}.q"]
    ours = ggflow.quantize(x, name)
    assert ours.shape == want.shape
    assert _blocks_differing(ours, want, type_traits(name).type_size).size == 0


@pytest.mark.parametrize("name", ("IQ4_NL", "IQ4_XS"))
def test_importance_weighted_quantization_writes_ggml_s_bytes(golden, name):
    x, g = golden
    t = type_traits(name)
    qw = np.tile(g["quant_weights"].reshape(-1, t.block_size), (x.shape[0], 1))   # the same per-column weights each row
    fn = iq4.quantize_iq4_nl if name == "IQ4_NL" else iq4.quantize_iq4_xs
    ours = fn(x.reshape(-1, t.block_size), qw)
    assert _blocks_differing(ours, g[f"{name}.imatrix"], t.type_size).size == 0
    assert _blocks_differing(ours, ggflow.quantize(x, name), t.type_size).size > 0   # the weights mattered


def test_iq4_nl_reference_quantizer_of_ggml(golden):
    """quantize_row_iq4_nl_ref (no refinement tries). ggml leaves an all-zero block's indices as whatever its
    stack array held (garbage in the golden rows): those blocks are compared by their value, zero."""
    x, g = golden
    ours = iq4.quantize_iq4_nl(x.reshape(-1, 32), ntry=-1)
    ref = g["IQ4_NL.q"].reshape(-1, 18)
    zero = np.abs(x.reshape(-1, 32)).max(axis=1) == 0
    assert zero.sum() > 0
    np.testing.assert_array_equal(ours[~zero], ref[~zero])
    assert not ours[zero, 0:2].any() and not ref[zero, 0:2].any()   # d = 0: the block decodes to zeros


@pytest.mark.parametrize("name", ENCODED)
def test_golden_bytes_decode_to_ggml_s_values(golden, name):
    _, g = golden
    rows = g["deq_rows"]
    assert_bits_equal(ggflow.dequantize(g[f"{name}.q"][rows], name), g[f"{name}.deq"])


@pytest.mark.parametrize("name", ENCODED)
def test_encoders_reject_non_finite_and_bad_shapes(name):
    t = type_traits(name)
    x = np.zeros((2, t.block_size), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(QuantizationError, match="non-finite"):
        t.from_float(x)
    with pytest.raises(QuantizationError, match=name):
        t.from_float(np.zeros((2, t.block_size + 1), np.float32))


def test_importance_weights_of_another_shape_are_refused():
    with pytest.raises(QuantizationError, match="importance weights"):
        iq4.quantize_iq4_xs(np.zeros((2, 256), np.float32), np.ones((1, 256), np.float32))


@pytest.mark.parametrize("name", ENCODED)
def test_round_trip_error_is_bounded(name):
    """Random weights of several magnitudes: the decoded values stay within the format's step of the input
    (IQ4: the table's widest gap, 24 of 127 of the block's largest |x|, plus fp16 scale rounding; ternary:
    half the block's largest |x|, rounding to -d, 0, +d)."""
    t = type_traits(name)
    rng = np.random.default_rng(11)
    for scale in (1e-3, 1.0, 1e3):
        x = (rng.standard_normal((64, t.block_size)) * scale).astype(np.float32)
        y = t.to_float(t.from_float(x))
        amax = np.abs(x).max(axis=1, keepdims=True)
        bound = amax * (0.5 if name.startswith("TQ") else 24 / 127) * 1.01
        if name == "IQ4_XS":
            bound = bound * 1.1   # the 6-bit sub-scales cost a little more
        assert np.all(np.abs(y - x) <= bound), (name, scale, float(np.max(np.abs(y - x) / amax)))
