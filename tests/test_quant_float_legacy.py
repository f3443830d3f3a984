"""F32/F16/BF16 and the legacy block formats (Q4_0..Q8_1): bit-exact with ggml, and sound.

The golden file holds ggml's own output; the property tests pin the behaviour the golden
inputs do not reach (ties, zeros, extreme magnitudes, bad shapes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import ggflow
from ggflow.core.types import type_traits
from ggflow.errors import QuantizationError
from tests.data_dir import DATA

GOLDEN = DATA / "golden" / "quant_ggml_seed1.npz"
GOLDEN_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1"]
FLOAT_TYPES = ["F32", "F16", "BF16"]
LEGACY_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1"]
# As ggml-cpu.c's type_traits_cpu pairs them.
VEC_DOT_TYPE = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q8_0", "Q4_1": "Q8_1",
                "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q8_0": "Q8_0", "Q8_1": "Q8_1"}

FAST = settings(max_examples=60, deadline=None)


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


def bits(a: np.ndarray) -> np.ndarray:
    """float32 as uint32, so NaNs and signed zeros compare by their bits."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def fp16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def fp16_error(v: np.ndarray) -> np.ndarray:
    """The most storing v (float64) in fp16 can change it: half an ulp, normal or subnormal."""
    return np.maximum(np.abs(v) * 2.0**-11, 2.0**-25)


def record(q: np.ndarray, type_name: str) -> np.ndarray:
    traits = type_traits(type_name)
    return q.reshape(-1, traits.type_size).view(traits.block_dtype).reshape(-1)


def quantize_blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    return ggflow.quantize(x.reshape(-1, 32), type_name)


# -- golden: ggml's reference output ---------------------------------------------------------
@pytest.mark.parametrize("type_name", GOLDEN_TYPES)
def test_quantize_matches_ggml_byte_for_byte(golden, type_name):
    q = ggflow.quantize(golden["input"], type_name)
    expected = golden[f"{type_name}.q"]
    assert q.dtype == np.uint8 and q.shape == expected.shape
    mismatched = np.flatnonzero(q != expected)
    assert mismatched.size == 0, f"{mismatched.size} bytes differ, first at flat index {mismatched[:5]}"


@pytest.mark.parametrize("type_name", [t for t in GOLDEN_TYPES if t != "Q8_1"])
def test_dequantize_matches_ggml_bit_for_bit(golden, type_name):
    deq = ggflow.dequantize(golden[f"{type_name}.q"], type_name)
    expected = golden[f"{type_name}.deq"]
    assert deq.dtype == np.float32 and deq.shape == expected.shape
    mismatched = np.flatnonzero(bits(deq) != bits(expected))
    assert mismatched.size == 0, f"{mismatched.size} values differ, first at flat index {mismatched[:5]}"


def test_q8_1_dequantizes_as_q8_0_does(golden):
    """ggml has no Q8_1 dequantizer; ours is q*d, so it must agree with Q8_0 on the same input."""
    assert np.array_equal(bits(ggflow.dequantize(golden["Q8_1.q"], "Q8_1")),
                          bits(ggflow.dequantize(golden["Q8_0.q"], "Q8_0")))


# -- traits ----------------------------------------------------------------------------------
# gguf-py still lists Q8_1 with float32 d and s (40 bytes); ggml's block_q8_1 has held two fp16
# since 2024 (36 bytes: static_assert in ggml-common.h, and the golden rows agree). Q8_1 only
# ever holds activations, never a GGUF tensor, so the stale entry is harmless there.
STALE_IN_GGUF = {"Q8_1": (32, 36)}


@pytest.mark.parametrize("type_name", FLOAT_TYPES + LEGACY_TYPES)
def test_traits_agree_with_gguf(type_name):
    traits = type_traits(type_name)
    gguf_type = GGMLQuantizationType[type_name]
    assert traits.type_id == gguf_type.value
    expected = STALE_IN_GGUF.get(type_name, GGML_QUANT_SIZES[gguf_type])
    assert (traits.block_size, traits.type_size) == expected
    assert type_traits(gguf_type.value) is traits
    assert traits.vec_dot_type == VEC_DOT_TYPE[type_name]
    assert type_traits(traits.vec_dot_type).block_size == traits.block_size


@pytest.mark.parametrize("type_name", GOLDEN_TYPES)
def test_row_size_agrees_with_ggml_rows(golden, type_name):
    n = golden["input"].shape[1]
    assert golden[f"{type_name}.q"].shape[1] == type_traits(type_name).row_bytes(n)


@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_block_dtype_describes_the_bytes(type_name):
    traits = type_traits(type_name)
    assert traits.block_dtype.itemsize == traits.type_size
    assert traits.block_dtype.names[0] == "d" and traits.block_dtype.fields["d"][1] == 0


@pytest.mark.parametrize("type_name,dtype", [("F32", "<f4"), ("F16", "<f2"), ("BF16", "<u2")])
def test_float_types_name_their_numpy_dtype(type_name, dtype):
    assert type_traits(type_name).numpy_dtype == np.dtype(dtype)


# -- float types -----------------------------------------------------------------------------
def every_float32_pattern(step: int = 997) -> np.ndarray:
    """A spread of all 2^32 float32 bit patterns: both signs, zeros, subnormals, inf, NaNs."""
    u = np.arange(0, 2**32, step, dtype=np.uint64).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                        0xFFFFFFFF, 0x00000001, 0x7F7FFFFF, 0x477FF000, 0x477FEFFF], dtype=np.uint32)
    return np.concatenate([u, special]).view(np.float32)


def test_f32_round_trip_keeps_every_bit():
    x = every_float32_pattern()
    assert np.array_equal(bits(ggflow.dequantize(ggflow.quantize(x, "F32"), "F32")), bits(x))


def test_f16_rounds_to_nearest_even_and_quiets_nan():
    x = every_float32_pattern()
    h = ggflow.quantize(x, "F16").view(np.uint16)
    finite = ~np.isnan(x)
    # Finite and infinite values: IEEE round-to-nearest-even, which numpy's cast implements.
    with np.errstate(over="ignore"):
        assert np.array_equal(h[finite], x[finite].astype(np.float16).view(np.uint16))
    # NaN: ggml writes the quiet NaN 0x7E00 with the input's sign, whatever the payload.
    sign = (x[~finite].view(np.uint32) >> 16).astype(np.uint16) & 0x8000
    assert np.array_equal(h[~finite], sign | 0x7E00)


def test_f16_ties_go_to_even():
    one_plus = np.float32([1 + 2.0**-11, 1 + 3 * 2.0**-11, 65520.0, 65519.996])
    assert ggflow.quantize(one_plus, "F16").view(np.uint16).tolist() == [0x3C00, 0x3C02, 0x7C00, 0x7BFF]


def test_f16_dequantize_is_exact_for_every_half():
    h = np.arange(2**16, dtype=np.uint16)
    out = ggflow.dequantize(h.view(np.uint8), "F16")
    ok = ~np.isnan(out)
    assert np.array_equal(out[ok].astype(np.float16).view(np.uint16), h[ok])
    assert np.isnan(h.view(np.float16)).sum() == (~ok).sum()


def test_bf16_keeps_every_representable_value():
    h = np.arange(2**16, dtype=np.uint32)
    x = (h << 16).view(np.float32)
    q = ggflow.quantize(x, "BF16").view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(q[~nan], h[~nan])
    assert np.all(q[nan] & 0x40)  # quieted
    assert np.array_equal(bits(ggflow.dequantize(q.view(np.uint8), "BF16"))[~nan], bits(x)[~nan])


@FAST
@given(arrays(np.uint32, 64, elements=st.integers(0, 2**32 - 1)))
def test_bf16_rounds_to_nearest_even(u):
    x = u.view(np.float32)
    q = ggflow.quantize(x, "BF16").view(np.uint16).astype(np.int64)
    top, low = (u >> 16).astype(np.int64), (u & 0xFFFF).astype(np.int64)
    up = (low > 0x8000) | ((low == 0x8000) & ((top & 1) == 1))
    expected = np.where(np.isnan(x), top | 0x40, top + up)
    assert np.array_equal(q, expected)


def test_bf16_keeps_subnormals_and_overflows_to_inf():
    x = np.float32([1e-40, -1e-40, 3.4028235e38])
    q = ggflow.quantize(x, "BF16").view(np.uint16)
    assert q[0] != 0 and q[1] != 0x8000  # not flushed to zero
    assert q[2] == 0x7F80


# -- legacy formats: error bounds ------------------------------------------------------------
def block_arrays(max_blocks: int = 8, magnitude: float = 1e3):
    return st.integers(1, max_blocks).flatmap(lambda n: arrays(
        np.float32, (n, 32), elements=st.floats(-magnitude, magnitude, width=32, allow_subnormal=False)))


def symmetric_bound(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0: d = max/-levels with max the signed largest-|x| element; q = x/d + levels in
    [0, 2*levels] clamped to 2*levels - 1. So each x is off by <= |d|/2 from its level, except
    x/d in (levels - 1/2, levels] (the end opposite max), which the clamp moves by up to |d|.
    Storing d in fp16 adds |q - levels| <= levels times d's fp16 error."""
    x = x.astype(np.float64)
    pick = np.argmax(np.abs(x), axis=1)
    d = x[np.arange(len(x)), pick] / -levels
    ratio = np.divide(x, d[:, None], out=np.zeros_like(x), where=d[:, None] != 0)
    steps = np.where(ratio > levels - 0.5, 1.0, 0.5)
    return np.abs(d)[:, None] * (steps + 1e-4) + levels * fp16_error(d)[:, None], d


@FAST
@given(block_arrays())
@pytest.mark.parametrize("type_name,levels", [("Q4_0", 8), ("Q5_0", 16)])
def test_symmetric_formats_stay_within_half_a_step(type_name, levels, x):
    bound, _ = symmetric_bound(x, levels)
    deq = ggflow.dequantize(quantize_blocks(x, type_name), type_name).reshape(x.shape)
    assert np.all(np.abs(x.astype(np.float64) - deq) <= bound)


@FAST
@given(block_arrays())
@pytest.mark.parametrize("type_name,levels", [("Q4_1", 15), ("Q5_1", 31)])
def test_min_offset_formats_stay_within_half_a_step(type_name, levels, x):
    """d = (max-min)/levels, q = round((x-min)/d) in [0, levels]: |x - (q*d + min)| <= d/2.
    d and min are stored in fp16, adding levels * err(d) + err(min)."""
    lo, hi = x.min(axis=1).astype(np.float64), x.max(axis=1).astype(np.float64)
    d = (hi - lo) / levels
    bound = d * (0.5 + 1e-4) + levels * fp16_error(d) + fp16_error(lo)
    deq = ggflow.dequantize(quantize_blocks(x, type_name), type_name).reshape(x.shape)
    assert np.all(np.abs(x.astype(np.float64) - deq) <= bound[:, None])


@FAST
@given(block_arrays())
@pytest.mark.parametrize("type_name", ["Q8_0", "Q8_1"])
def test_q8_formats_stay_within_half_a_step(type_name, x):
    """d = amax/127, q = round(x/d) in [-127, 127]: |x - q*d| <= d/2, plus 127 * err(fp16(d))."""
    d = np.abs(x).max(axis=1).astype(np.float64) / 127
    bound = d * (0.5 + 1e-4) + 127 * fp16_error(d)
    deq = ggflow.dequantize(quantize_blocks(x, type_name), type_name).reshape(x.shape)
    assert np.all(np.abs(x.astype(np.float64) - deq) <= bound[:, None])


@FAST
@given(block_arrays())
def test_q8_1_sum_field_is_d_times_sum_of_quants(x):
    """ggml: s = fp16(sum(qs) * d) with d the float32 scale before fp16 rounding."""
    rec = record(quantize_blocks(x, "Q8_1"), "Q8_1")
    d32 = np.abs(x).max(axis=1) / np.float32(127)
    total = rec["qs"].astype(np.int32).sum(axis=1).astype(np.float32)
    assert np.array_equal(rec["s"].view(np.uint16), (total * d32).astype(np.float16).view(np.uint16))


def test_q8_rounds_halves_away_from_zero():
    """With amax = 127 the scale is exactly 1, so x/d = x and C's roundf decides every tie."""
    x = np.zeros(32, dtype=np.float32)
    x[:7] = [127, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5]
    assert record(quantize_blocks(x, "Q8_0"), "Q8_0")["qs"][0, :7].tolist() == [127, 1, -1, 2, -2, 3, -3]


# -- legacy formats: special blocks ----------------------------------------------------------
@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_all_zero_blocks_give_zeros(type_name):
    deq = ggflow.dequantize(quantize_blocks(np.zeros((3, 32), np.float32), type_name), type_name)
    assert np.all(deq == 0)


@FAST
@given(st.floats(-6e4, 6e4, width=32).filter(lambda c: abs(c) > 1e-3))
@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_constant_blocks_come_back_within_fp16_precision(type_name, c):
    """A constant block is carried by its scale (or min) alone, so only fp16 rounding remains:
    Q*_1 store c as the min, in fp16; the others store d = c/levels and give back levels * fp16(d)."""
    deq = ggflow.dequantize(quantize_blocks(np.full(32, c, np.float32), type_name), type_name)
    if type_name in ("Q4_1", "Q5_1"):
        assert np.all(deq == fp16(c))
    else:
        levels = {"Q4_0": 8, "Q5_0": 16}.get(type_name, 127)
        assert np.all(np.abs(deq - c) <= levels * fp16_error(np.float64(c) / levels) + abs(c) * 2.0**-20)


@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_power_of_two_scaling_leaves_the_quants_unchanged(type_name):
    """x*2^k scales d by 2^k exactly, so q = x/d is the same; shown on huge (~1e30), tiny (~1e-30)
    and ordinary blocks. The fp16 scale saturates to inf (huge) or 0 (tiny), as ggml's does."""
    x = np.random.default_rng(7).normal(size=(4, 32)).astype(np.float32)
    base = record(quantize_blocks(x, type_name), type_name)
    for k in (100, -100):
        scaled = record(quantize_blocks(x * np.float32(2.0**k), type_name), type_name)
        assert np.array_equal(scaled["qs"], base["qs"])
        expected_d = np.inf if k > 0 else 0.0
        assert np.all(np.abs(scaled["d"].astype(np.float32)) == expected_d)


@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_tiny_and_subnormal_blocks_dequantize_to_zero(type_name):
    """Below fp16's range the scale (and min) round to 0, whatever ggml's quants were."""
    rng = np.random.default_rng(3)
    for scale in (1e-30, 1e-40):
        x = (rng.normal(size=(4, 32)) * scale).astype(np.float32)
        assert np.all(ggflow.dequantize(quantize_blocks(x, type_name), type_name) == 0)


@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_huge_blocks_dequantize_to_infinities(type_name):
    """1e30 is beyond fp16's 65504: the scale is stored as inf, as ggml stores it, so nothing
    finite comes back (q*inf is inf, or NaN where q is 0)."""
    x = np.linspace(-1e30, 1e30, 32, dtype=np.float32)
    deq = ggflow.dequantize(quantize_blocks(x, type_name), type_name)
    assert not np.isfinite(deq).any()


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_non_finite_input_is_a_quantization_error(type_name, bad):
    x = np.ones(64, dtype=np.float32)
    x[40] = bad
    with pytest.raises(QuantizationError, match="non-finite.*index 40"):
        ggflow.quantize(x, type_name)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q5_0"])
def test_zero_block_scale_is_negative_zero_whatever_the_zeros_signs(type_name):
    """ggml's scan starts from max = +0.0 and never replaces it by a -0.0 (|-0| is not > 0),
    so d = +0.0 / -levels = -0.0 (fp16 0x8000) for every all-zero block."""
    zeros = np.zeros((2, 32), np.float32)
    zeros[1] = -0.0
    assert record(quantize_blocks(zeros, type_name), type_name)["d"].view(np.uint16).tolist() == [0x8000] * 2


def test_q4_1_takes_the_first_of_equal_minima():
    """C's strict `v < min` keeps the first of +0.0 / -0.0, which sets the sign bit of m."""
    first_neg = np.zeros(32, np.float32)
    first_neg[0] = -0.0
    m_pos = record(quantize_blocks(np.zeros(32, np.float32), "Q4_1"), "Q4_1")["m"].view(np.uint16)
    m_neg = record(quantize_blocks(first_neg, "Q4_1"), "Q4_1")["m"].view(np.uint16)
    assert (m_pos[0], m_neg[0]) == (0x0000, 0x8000)


# -- shapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", LEGACY_TYPES)
def test_row_not_a_multiple_of_the_block_is_an_error(type_name):
    with pytest.raises(QuantizationError, match="multiple of the block size 32"):
        ggflow.quantize(np.zeros((2, 48), np.float32), type_name)


@pytest.mark.parametrize("type_name", LEGACY_TYPES + ["F16", "BF16"])
def test_bytes_not_a_whole_number_of_blocks_is_an_error(type_name):
    size = type_traits(type_name).type_size
    with pytest.raises(QuantizationError, match="whole number"):
        ggflow.dequantize(np.zeros((2, 3 * size + 1), np.uint8), type_name)


@pytest.mark.parametrize("type_name", FLOAT_TYPES + LEGACY_TYPES)
def test_block_functions_reject_wrong_shapes(type_name):
    traits = type_traits(type_name)
    with pytest.raises(QuantizationError, match="from_float takes"):
        traits.from_float(np.zeros((2, traits.block_size + 1), np.float32))
    with pytest.raises(QuantizationError, match="to_float takes"):
        traits.to_float(np.zeros((2, traits.type_size + 1), np.uint8))


@pytest.mark.parametrize("type_name", FLOAT_TYPES + LEGACY_TYPES)
def test_batch_axes_are_kept(type_name):
    x = np.random.default_rng(1).normal(size=(2, 3, 64)).astype(np.float32)
    q = ggflow.quantize(x, type_name)
    assert q.shape == (2, 3, type_traits(type_name).row_bytes(64))
    assert np.array_equal(q.reshape(6, -1), ggflow.quantize(x.reshape(6, 64), type_name))
    assert ggflow.dequantize(q, type_name).shape == x.shape
