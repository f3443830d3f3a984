"""K-quants (Q2_K..Q6_K, Q8_K): byte-exact with ggml's reference quantizers, and sane round trips."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import ggflow
from ggflow.core.types import type_traits
from ggflow.errors import QuantizationError
from ggflow.plugins.manager import get_plugin_manager
from ggflow.quant_builtin import _kquant_encoders, kquants
from tests.data_dir import DATA

SHARED = DATA
GOLDEN = SHARED / "golden" / "quant_ggml_seed1.npz"
K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]
QK_K = 256

# Error bounds, per 256-element block with largest magnitude amax.
# A b-bit code spans the block's range (at most 2*amax) in 2^b - 1 steps, so rounding alone
# costs amax/2^b or so; allow 4x that for the 4/6-bit sub-block scales, the fp16 super-scales
# and the deliberate clipping of ggml's scale searches (observed worst cases stay below ~2.7x).
BITS = {"Q2_K": 2, "Q3_K": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6, "Q8_K": 8}
# The super-scale d (and dmin) is an fp16, whose absolute precision bottoms out at 2^-24 (the
# smallest subnormal); a rounding error of d is multiplied by the largest scale code and level.
# Q8_K keeps d as float32: only blocks so small that -127/amax overflows float32 lose it.
MAX_CODE_TIMES_LEVEL = {"Q2_K": 2 * 15 * 3, "Q3_K": 32 * 4, "Q4_K": 2 * 63 * 15,
                        "Q5_K": 2 * 63 * 31, "Q6_K": 128 * 32}


def abs_floor(name: str) -> float:
    return 1e-36 if name == "Q8_K" else 2.0**-24 * MAX_CODE_TIMES_LEVEL[name]


def max_error_bound(name: str, amax: np.ndarray) -> np.ndarray:
    return 4.0 * amax / 2 ** BITS[name] + abs_floor(name)


def rms_error_bound(name: str, amax: np.ndarray) -> np.ndarray:
    return 2.0 * amax / 2 ** BITS[name] + abs_floor(name)


def round_trip(x: np.ndarray, name: str) -> np.ndarray:
    return ggflow.dequantize(ggflow.quantize(x, name), name)


def assert_error_bounded(x: np.ndarray, name: str) -> None:
    blocks = x.reshape(-1, QK_K).astype(np.float64)
    err = round_trip(x, name).reshape(-1, QK_K) - blocks
    amax = np.abs(blocks).max(axis=1)
    max_err = np.abs(err).max(axis=1)
    rms_err = np.sqrt((err**2).mean(axis=1))
    assert (max_err <= max_error_bound(name, amax)).all(), (
        f"{name}: max error {max_err} exceeds {max_error_bound(name, amax)} (amax {amax})")
    assert (rms_err <= rms_error_bound(name, amax)).all(), (
        f"{name}: rms error {rms_err} exceeds {rms_error_bound(name, amax)} (amax {amax})")


# -- ggml's own outputs ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN)


def row_labels(golden, rows: np.ndarray) -> list[str]:
    dists = golden["dists"]
    per_dist = golden["input"].shape[0] // len(dists)
    return [f"{r} ({dists[r // per_dist]})" for r in rows]


@pytest.mark.parametrize("name", K_TYPES)
def test_quantize_reproduces_ggml_bytes(golden, name):
    q = ggflow.quantize(golden["input"], name)
    expected = golden[f"{name}.q"]
    assert q.shape == expected.shape
    bad = np.flatnonzero((q != expected).any(axis=1))
    assert bad.size == 0, f"{name}: rows {row_labels(golden, bad)} differ from ggml's bytes"


@pytest.mark.parametrize("name", K_TYPES)
def test_dequantize_reproduces_ggml_bits(golden, name):
    y = ggflow.dequantize(golden[f"{name}.q"], name)
    expected = golden[f"{name}.deq"]
    assert y.dtype == np.float32 and y.shape == expected.shape
    bad = np.flatnonzero((y.view(np.uint32) != expected.view(np.uint32)).any(axis=1))
    assert bad.size == 0, f"{name}: rows {row_labels(golden, bad)} differ from ggml's floats"


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_dequantize_agrees_with_gguf_py_on_arbitrary_bytes(name):
    # Random bytes reach every scale code, sign and fp16 special (inf, NaN, subnormal).
    raw = np.random.default_rng(7).integers(0, 256, (64, type_traits(name).type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        expected = gguf_quants.dequantize(raw, GGMLQuantizationType[name]).astype(np.float32)
    np.testing.assert_array_equal(ggflow.dequantize(raw, name), expected.reshape(64, QK_K))


# -- traits and layout -------------------------------------------------------------------------
@pytest.mark.parametrize("name", K_TYPES)
def test_traits_agree_with_gguf_constants(name):
    traits = type_traits(name)
    gtype = GGMLQuantizationType[name]
    assert traits.type_id == gtype.value
    assert (traits.block_size, traits.type_size) == GGML_QUANT_SIZES[gtype]
    assert traits.block_dtype.itemsize == traits.type_size
    assert traits.vec_dot_type == "Q8_K"
    assert type_traits(traits.type_id) is traits


@pytest.mark.parametrize("name", K_TYPES)
def test_registered_by_the_kquants_plugin(name):
    registration = get_plugin_manager().quant_types.registration(name)
    assert registration.obj is getattr(kquants, name)
    assert registration.source.plugin == "quant_kquants"


def test_q8_k_block_record_holds_scale_quants_and_16_sums():
    x = np.random.default_rng(3).standard_normal((5, QK_K)).astype(np.float32)
    q = ggflow.quantize(x, "Q8_K")
    records = q.view(kquants.BLOCK_Q8_K).reshape(-1)
    sums_of_16 = records["qs"].astype(np.int32).reshape(5, 16, 16).sum(-1)
    np.testing.assert_array_equal(records["bsums"], sums_of_16)
    assert (np.abs(records["qs"]) <= 127).all()
    np.testing.assert_array_equal(records["d"][:, None] * records["qs"], ggflow.dequantize(q, "Q8_K"))


@pytest.mark.parametrize("name", K_TYPES)
def test_block_order_and_thread_chunking_do_not_change_bytes(name):
    rng = np.random.default_rng(11)
    magnitudes = rng.uniform(1e-3, 1e3, (13, 1)).astype(np.float32)
    blocks = rng.standard_normal((13, QK_K)).astype(np.float32) * magnitudes
    size = type_traits(name).type_size
    serial = np.empty((13, size), np.uint8)
    getattr(_kquant_encoders, f"quantize_{name.lower()}")(blocks, serial, 0, 13)
    one_by_one = np.concatenate([ggflow.quantize(b[None], name) for b in blocks])
    np.testing.assert_array_equal(serial, one_by_one)
    for n_chunks in (1, 3, 13):
        chunked = np.empty((13, size), np.uint8)
        getattr(_kquant_encoders, f"quantize_{name.lower()}_parallel")(blocks, chunked, n_chunks)
        np.testing.assert_array_equal(chunked, serial)


# -- scalar helpers that carry ggml's rounding -------------------------------------------------
def test_nearest_int_rounds_half_to_even_like_rint():
    rng = np.random.default_rng(5)
    values = np.concatenate([np.arange(-40, 40) + np.float32(0.5),
                             rng.uniform(-4194303, 4194303, 300),
                             rng.uniform(-3, 3, 300)]).astype(np.float32)
    got = np.array([_kquant_encoders.nearest_int(v) for v in values])
    np.testing.assert_array_equal(got, np.rint(values).astype(np.int64))


def test_fp16_rounding_matches_ieee_round_to_nearest_even():
    rng = np.random.default_rng(6)
    # Every exponent from far below half's subnormals to past its overflow, random mantissas,
    # plus exact ties (mantissa ...1000...) and the specials.
    exponents = rng.integers(96, 146, 4000).astype(np.uint32)
    mantissas = rng.integers(0, 1 << 23, 4000).astype(np.uint32)
    ties = (mantissas & ~np.uint32(0x1FFF)) | np.uint32(0x1000)
    bits = np.concatenate([(exponents << 23) | mantissas, (exponents << 23) | ties])
    bits |= rng.integers(0, 2, bits.size).astype(np.uint32) << 31
    values = np.concatenate([bits.view(np.float32),
                             np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520,
                                       2**-25, 2**-24, 2**-14 - 2**-25], np.float32)])
    got = np.array([_kquant_encoders.fp16_bits(v) for v in values], np.uint16)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, expected)
    back = np.array([_kquant_encoders.fp16_value(b) for b in got], np.float32)
    np.testing.assert_array_equal(back, got.view(np.float16).astype(np.float32))


# -- round trips -------------------------------------------------------------------------------
def scaled_blocks(max_blocks: int = 3, min_exp: float = -9.0, max_exp: float = 5.0):
    """1..max_blocks blocks of values in [-1, 1] times 10^e, e drawn per example."""
    shapes = st.integers(1, max_blocks).map(lambda n: (n, QK_K))
    unit = shapes.flatmap(lambda s: arrays(np.float32, s, elements=st.floats(-1, 1, width=32)))
    return st.tuples(unit, st.floats(min_exp, max_exp)).map(lambda t: t[0] * np.float32(10.0 ** t[1]))


@pytest.mark.parametrize("name", K_TYPES)
@settings(max_examples=40, deadline=None)
@given(x=scaled_blocks())
def test_round_trip_error_is_bounded(name, x):
    assert_error_bounded(x, name)


@pytest.mark.parametrize("name", K_TYPES)
def test_round_trip_error_is_bounded_on_typical_weights(name):
    rng = np.random.default_rng(4)
    normal = rng.standard_normal((32, QK_K)) * 0.02
    heavy = rng.standard_t(2, (32, QK_K))
    sparse = rng.standard_normal((32, QK_K)) * (rng.random((32, QK_K)) < 0.05)
    assert_error_bounded(np.concatenate([normal, heavy, sparse]).astype(np.float32), name)


@pytest.mark.parametrize("name", K_TYPES)
def test_all_zero_blocks_encode_to_zero_bytes_and_decode_to_zeros(name):
    q = ggflow.quantize(np.zeros((3, QK_K), np.float32), name)
    assert not q.any()
    assert (ggflow.dequantize(q, name) == 0).all()


@pytest.mark.parametrize("name", K_TYPES)
@settings(max_examples=25, deadline=None)
@given(c=st.floats(1.0, 1e5, width=32), negative=st.booleans())
def test_constant_blocks_come_back_to_fp16_precision(name, c, negative):
    # A constant block needs one scale, stored as an fp16 (11-bit significand): relative error
    # 2^-11 from that rounding, doubled for the float32 products around it.
    value = np.float32(-c if negative else c)
    y = round_trip(np.full((1, QK_K), value, np.float32), name)
    assert np.abs(y - value).max() <= abs(value) * 2.0**-10


@pytest.mark.parametrize("name", K_TYPES)
def test_large_magnitudes_keep_relative_error(name):
    # amax ~4e5 is inside every fp16 super-scale's range (the tightest, Q2_K's dmin, overflows near 1e6).
    x = np.random.default_rng(8).standard_normal((4, QK_K)).astype(np.float32) * np.float32(1e5)
    assert_error_bounded(x, name)


def test_q8_k_keeps_relative_error_across_the_float32_range():
    x = np.random.default_rng(9).standard_normal((2, QK_K)).astype(np.float32)
    for scale in (1e-30, 1e30):
        assert_error_bounded(x * np.float32(scale), "Q8_K")


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_blocks_below_fp16_resolution_decode_to_zero(name):
    # Their super-scale rounds to fp16 zero, as in ggml: the block decodes to zeros, never to garbage.
    x = np.random.default_rng(10).standard_normal((2, QK_K)).astype(np.float32) * np.float32(1e-10)
    assert (round_trip(x, name) == 0).all()


# -- errors a user can cause -------------------------------------------------------------------
@pytest.mark.parametrize("name", K_TYPES)
@pytest.mark.parametrize("n", [1, 255, 300, 1000])
def test_rows_not_a_multiple_of_256_are_rejected(name, n):
    with pytest.raises(QuantizationError, match="multiple of the block size 256"):
        ggflow.quantize(np.ones((2, n), np.float32), name)


@pytest.mark.parametrize("name", K_TYPES)
def test_byte_rows_not_whole_blocks_are_rejected(name):
    with pytest.raises(QuantizationError, match=name):
        ggflow.dequantize(np.zeros((2, type_traits(name).type_size + 1), np.uint8), name)


@pytest.mark.parametrize("name", K_TYPES)
def test_from_float_rejects_wrong_block_shape(name):
    with pytest.raises(QuantizationError, match=r"\(n_blocks, 256\)"):
        type_traits(name).from_float(np.zeros((2, 32), np.float32))


@pytest.mark.parametrize("name", K_TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_rejected(name, bad):
    x = np.zeros((1, QK_K), np.float32)
    x[0, 17] = bad
    with pytest.raises(QuantizationError, match="non-finite"):
        ggflow.quantize(x, name)
