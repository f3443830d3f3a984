"""quant_matmul: the CPU backend's matmul kernels for every GGUF weight type.

The kernels quantize activations as ggml does, so their results differ from the float product
W @ x by the activation rounding. Each tolerance below is that rounding's worst case, derived per
output from the quantizer's step (plus the f32 accumulation bound), not a guessed rtol.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

import ggflow
from ggflow.backends_builtin.cpu.products.qmm import act
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
from ggflow.backends_builtin.cpu.products.qmm.amx import amx_available
from ggflow.backends_builtin.cpu.products.qmm.quads import quads_are_exact
from ggflow.core.types import type_traits
from ggflow.errors import BackendError, ShapeError
from tests.data_dir import DATA

GOLDEN = DATA / "golden" / "quant_ggml_seed1.npz"
U = 2.0 ** -24                       # f32 unit roundoff
F16_REL = 2.0 ** -11                 # f16 rounding, relative
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
FLOATS = ["F32", "F16", "BF16"]
ROWS = 300                            # not a multiple of the row tile (64) nor of 16
TOKENS = [1, 3, 64]


def golden():
    return np.load(GOLDEN)


def weight(w_type: str, rows: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes, their dequantized float64 values) of a random rows x k weight."""
    w = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
    q = ggflow.quantize(w, w_type)
    return q, ggflow.dequantize(q, w_type).astype(np.float64)


def activations(n: int, k: int, seed: int = 1) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    x[:, :7] *= 40.0      # a few large values, so blocks have different scales
    return x


def run(pw, x: np.ndarray) -> np.ndarray:
    out = np.full((x.shape[0], pw.rows), np.nan, np.float32)
    qmm.mul_mat(pw, x, out)
    return out


def f16_field(q: np.ndarray, w_type: str, offset: int) -> np.ndarray:
    """The f16 at byte ``offset`` of every block of a weight, (rows, blocks) float64."""
    size = {"Q4_1": 20, "Q5_1": 24, "Q2_K": 84, "Q4_K": 144, "Q5_K": 176}[w_type]
    blocks = np.ascontiguousarray(q.reshape(q.shape[0], -1, size)[:, :, offset:offset + 2])
    return blocks.view(np.float16)[..., 0].astype(np.float64)


def term_magnitude(w_type: str, q: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """Per element, a bound on the magnitude of the terms the kernel sums for it. Types with a min
    (w = d * q + m, or d * sc * q - dmin * m) sum the two parts separately, so they can cancel."""
    per_block = wd.shape[1] // (32 if w_type in LEGACY else 256)
    if w_type in ("Q4_1", "Q5_1"):
        m = np.repeat(f16_field(q, w_type, 2), 32, axis=1)
        return np.abs(wd - m) + np.abs(m)
    if w_type in ("Q2_K", "Q4_K", "Q5_K"):
        offset, max_min = (82, 15) if w_type == "Q2_K" else (2, 63)
        dmin = np.repeat(np.abs(f16_field(q, w_type, offset)), 256, axis=1)
        return np.abs(wd) + 2 * max_min * dmin
    assert per_block > 0
    return np.abs(wd)


def accumulation_slack(abs_w: np.ndarray, abs_x: np.ndarray, terms: int) -> np.ndarray:
    """Worst-case f32 summation error of ``terms`` additions of products bounded by |w| @ |x|."""
    return 2 * (terms + 4) * U * (abs_x @ abs_w.T)


# ------------------------------------------------------------------------- activation quantizers
@pytest.mark.parametrize("name", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantizer_matches_ggml_bytes(name):
    data = golden()
    x = data["input"]
    if name == "Q8_K":
        to_bytes = act.q8_K_to_ggml_bytes
    elif name == "Q8_1":
        to_bytes = act.q8_1_to_ggml_bytes
    else:
        to_bytes = lambda xq, d, extra: act.q8_0_to_ggml_bytes(xq, d)  # noqa: E731
    got = to_bytes(*qmm.quantize_activations(x, name))
    np.testing.assert_array_equal(got, data[f"{name}.q"])


def test_q8_0_block_sums_are_the_sums_of_the_quants():
    x = activations(3, 256)
    xq, d, sums = qmm.quantize_activations(x, "Q8_0")
    np.testing.assert_array_equal(sums, xq.reshape(3, -1, 32).sum(-1))
    assert np.abs(xq).max() <= 127


def test_q8_K_bsums_are_sums_of_16():
    x = activations(2, 512)
    xq, d, bsums = qmm.quantize_activations(x, "Q8_K")
    np.testing.assert_array_equal(bsums, xq.reshape(2, -1, 16).sum(-1))


def test_f16_round_matches_numpy_half_conversion():
    rng = np.random.default_rng(3)
    v = np.concatenate([
        np.abs(rng.standard_normal(2000)).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 5, 2000),
        np.float32([0.0, 6e-8, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 65504.0, 65519.0, 65520.0, 1e6,
                    1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11]),     # subnormals, ties, the overflow edge
    ]).astype(np.float32)
    with np.errstate(over="ignore"):
        expected = v.astype(np.float16).astype(np.float32)
    got = np.array([act.f16_round(float(a)) for a in v], np.float32)
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------- quantized weight types
def x_error_bound_q8_0(x: np.ndarray) -> np.ndarray:
    """Per-element bound of |x - q * d16| for ggml's Q8_0 / Q8_1: q = round(x / d), d = amax / 127,
    off by at most d/2, and the stored d16 = f16(d) moves q * d by up to 127 * d * 2**-11."""
    n, k = x.shape
    d = np.abs(x.astype(np.float64)).reshape(n, k // 32, 32).max(-1) / 127
    return np.repeat(d * (0.5 + 127 * F16_REL) * (1 + 4 * U), 32, axis=1) + 4 * U * np.abs(x)


def x_error_bound_q8_K(x: np.ndarray) -> np.ndarray:
    """Q8_K: q = rint(x * iscale), d = 1 / iscale kept in f32: off by d/2 plus the f32 rounding
    of the product and of d."""
    n, k = x.shape
    xb = np.abs(x.astype(np.float64)).reshape(n, k // 256, 256)
    d = xb.max(-1) / 127
    return np.repeat(d * 0.5, 256, axis=1) + 4 * U * np.abs(x)


@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("w_type", ["Q4_0", "Q5_0", "Q8_0"] + KQUANTS)
def test_quantized_matmul_is_within_the_activation_rounding_of_the_float_product(w_type, n):
    """Q8_0 / Q8_K activations: the kernel's result is exactly dequant(W) @ dequant(x) up to f32
    accumulation, so |error| <= sum_j |w_j| * |x_j - dequant(x)_j| per output."""
    k = 512 if w_type in KQUANTS else 96          # legacy: 3 blocks, not a multiple of 256
    q, wd = weight(w_type, ROWS, k)
    x = activations(n, k)
    got = run(qmm.pack_weight(q, w_type), x)
    exact = x.astype(np.float64) @ wd.T
    ebound = x_error_bound_q8_K(x) if w_type in KQUANTS else x_error_bound_q8_0(x)
    bound = ebound @ np.abs(wd).T + accumulation_slack(term_magnitude(w_type, q, wd), np.abs(x) + ebound, k // 16 + 8)
    err = np.abs(got - exact)
    assert np.all(err <= bound), f"worst excess {np.max(err - bound):.3g}"
    # the bound is a worst case; the typical error (a random walk over k terms) is still a fair part of it
    assert np.median(err / bound) > 0.005


@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("w_type", ["Q4_1", "Q5_1"])
def test_q8_1_types_are_within_the_activation_rounding_of_the_float_product(w_type, n):
    """Q4_1 / Q5_1: w = d * q + m per block; ggml adds m * s with s = f16(d_x * sum(q_x)) rounded on
    its own, so the min term carries the f16 rounding of s besides the per-element rounding:
    error <= sum_j |d q_j| e_j + |m| * (sum_j e_j + 2**-11 * |s|) per block, e_j the bound on
    |x_j - dequant(x)_j|."""
    k = 96
    q, wd = weight(w_type, ROWS, k)
    x = activations(n, k)
    got = run(qmm.pack_weight(q, w_type), x)
    exact = x.astype(np.float64) @ wd.T
    m = f16_field(q, w_type, 2)                                         # (rows, blocks)
    ebound = x_error_bound_q8_0(x)                                      # (n, k)
    per_element = ebound @ term_magnitude(w_type, q, wd).T
    block_sum = np.abs(x.astype(np.float64)).reshape(n, k // 32, 32).sum(-1) + 32 * ebound[:, ::32]
    s_rounding = F16_REL * (1 + 4 * U) * block_sum @ np.abs(m).T
    bound = per_element + s_rounding + accumulation_slack(term_magnitude(w_type, q, wd), np.abs(x) + ebound, k // 16 + 8)
    err = np.abs(got - exact)
    assert np.all(err <= bound), f"worst excess {np.max(err - bound):.3g}"


@pytest.mark.parametrize("w_type", LEGACY + KQUANTS)
def test_quantized_matmul_equals_ggml_integer_dot_on_its_own_quantized_activations(w_type):
    """With the activations the kernel quantized, ggml's dot is exact integers times f32 scales:
    compare to that computed in float64 (only the f32 accumulation may differ)."""
    k = 512 if w_type in KQUANTS else 96
    q, wd = weight(w_type, ROWS, k, seed=5)
    x = activations(64, k, seed=6)
    got = run(qmm.pack_weight(q, w_type), x)
    vdt = qmm.pack_weight(q, w_type).vec_dot_type
    xq, d, extra = qmm.quantize_activations(x, vdt)
    xd = xq * np.repeat(d.astype(np.float64), k // d.shape[1], axis=1)
    want = xd @ wd.T
    if vdt == "Q8_1":    # the min term uses ggml's s = f16(d * sum(q)) rather than sum(q * d16)
        want += (extra - xd.reshape(64, -1, 32).sum(-1)) @ f16_field(q, w_type, 2).T
    bound = accumulation_slack(term_magnitude(w_type, q, wd), np.abs(xd), k // 16 + 8)
    assert np.all(np.abs(got - want) <= bound)


def batch_paths(w_type: str) -> list[str]:
    """The batched kernels a type has: the tile one, the pairs one, quads where it brings decode_quads (and they
    are exact for its bias here: Q8_0's whole signed bytes need VNNI), and AMX's tiles where this CPU has them."""
    pieces = qmm.cpu_pieces(type_traits(w_type))
    quads = pieces.decode_quads is not None and quads_are_exact(pieces.quad_bias)
    amx = tmpl.amx_takes(pieces) and amx_available()
    return ["tile", "pairs"] + (["quads"] if quads else []) + (["amx"] if amx else [])


def quads_or_tiles(n_tokens: int) -> str:
    """The path a Q8_0-like type with quads takes for n_tokens: the quads, or from AMX_MIN_TOKENS AMX's tiles
    where this CPU has them."""
    return "amx" if n_tokens >= tmpl.AMX_MIN_TOKENS and amx_available() else "quads"


# 2: the matvec (tile), one pass of two (quads); 3: one token per pass (tile), a pass of two and one more
# (quads); 4: one whole pass; 5 and 7: a last pass over the last four tokens (tile, pairs) or one token after
# whole passes (quads); 9: more passes; one past BLOCK_QUADS_MAX_TOKENS: the quads of a decoded block
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 9, tmpl.BLOCK_QUADS_MAX_TOKENS + 1])
@pytest.mark.parametrize("w_type", LEGACY + KQUANTS)
def test_every_batched_path_gives_the_matvec_results_bit_for_bit(w_type, n):
    k = 256
    q, _ = weight(w_type, 70, k, seed=7)
    pw = qmm.pack_weight(q, w_type)
    x = activations(n, k, seed=8)
    one_by_one = np.concatenate([run(pw, x[i:i + 1]) for i in range(n)])
    np.testing.assert_array_equal(run(pw, x), one_by_one)      # the path mul_mat chooses
    for path in batch_paths(w_type):
        batched = np.full((n, pw.rows), np.nan, np.float32)
        pw.drivers.get(False, path)(*kernel_args(pw, x), batched)
        np.testing.assert_array_equal(batched, one_by_one, err_msg=f"the {path} kernel")


@pytest.mark.parametrize("w_type", ["Q4_K", "Q5_K", "Q6_K"])
def test_block_quads_fold_their_scales_only_where_the_quads_sum_one_group_a_scale(w_type):
    """The K-quants' block_quads fold the scales in and bring the accumulate that reads that; where the quads add
    in int16 pairs (AVX2) Q5_K and Q6_K sum their int16 groups apart, fold nothing, and take their accumulate."""
    pieces = qmm.cpu_pieces(type_traits(w_type))
    assert tmpl.block_quads_accumulate(pieces, True) is pieces.accumulate_block_quads
    on_int16_pairs = tmpl.block_quads_accumulate(pieces, False)
    if pieces.quad_groups_int32:
        assert on_int16_pairs is pieces.accumulate
    else:
        assert on_int16_pairs is pieces.accumulate_block_quads


def test_q8_0_quads_are_exact_at_the_extremes_of_a_signed_byte():
    # every weight -128 or 127 (stored + 128: 0 or 255) against activations quantized to +-127: the
    # largest products and bias corrections a Q8_0 block can hold, in every group
    if not quads_are_exact(128):
        pytest.skip("no AVX512-VNNI here: Q8_0's quads (bias 128) would overflow AVX2's int16 pair sums")
    rows, k, n = 32, 256, 5
    rng = np.random.default_rng(3)
    blocks = np.zeros((rows, k // 32, 34), np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    blocks[:, :, 2:] = np.where(rng.random((rows, k // 32, 32)) < 0.5, -128, 127).astype(np.int8).view(np.uint8)
    pw = qmm.pack_weight(blocks.reshape(rows, -1), "Q8_0")
    x = np.where(rng.random((n, k)) < 0.5, -1.0, 1.0).astype(np.float32)     # quantizes to +-127
    one_by_one = np.concatenate([run(pw, x[i:i + 1]) for i in range(n)])
    quads = np.full((n, rows), np.nan, np.float32)
    pw.drivers.get(False, "quads")(*kernel_args(pw, x), quads)
    np.testing.assert_array_equal(quads, one_by_one)
    # against float64 (d 0.5; x's scale 1/127 is stored in f16, 6e-5 off): within 1e-3 of sum |x * w|
    want = x @ np.where(blocks[:, :, 2:].view(np.int8).reshape(rows, k) < 0, -64.0, 63.5).T
    np.testing.assert_allclose(quads, want, rtol=0, atol=1e-3 * k * 64)


def test_q8_0_takes_the_quads_from_one_token_only_where_they_are_exact():
    pw = qmm.pack_weight(weight("Q8_0", 70, 256)[0], "Q8_0")
    for n in (1, 4, 64):
        assert (tmpl.batch_path(pw.kind, n) == quads_or_tiles(n)) == quads_are_exact(128)


def test_products_take_the_quads_kernel_from_the_types_own_token_count():
    q, _ = weight("Q2_K", 70, 256)      # no block_quads: its decoded quads from its quads_from
    pw = qmm.pack_weight(q, "Q2_K")
    assert qmm.cpu_pieces(type_traits("Q2_K")).quads_from == 2
    assert pw.kernel(False, 2) is pw.drivers.get(False, "quads")
    assert pw.kernel(False, 1) is pw.drivers.get(False, "tile")


def test_types_with_block_quads_take_the_quads_kernel_below_their_quads_from():
    """Q5_0's decoded quads pay from 8 tokens (quads_from), its quads read in place from one."""
    q, _ = weight("Q5_0", 70, 256)
    pw = qmm.pack_weight(q, "Q5_0")
    assert qmm.cpu_pieces(type_traits("Q5_0")).quads_from == 8
    for n in (1, 7, 8, tmpl.BLOCK_QUADS_MAX_TOKENS + 1):
        assert pw.kernel(False, n) is pw.drivers.get(False, quads_or_tiles(n)), n


def kernel_args(pw, x):
    """What mul_mat hands a packed weight's compiled kernels, before out."""
    if pw.vec_dot_type is not None:
        return (pw.kind, pw.arrays, *qmm.quantize_activations(x, pw.vec_dot_type))
    return pw.kind, pw.arrays[0], (pw.rounding(x) if pw.rounding else x)


BIG = (520, 2048)      # rows x k: one token is over PARALLEL_MIN_MACS, so mul_mat goes parallel


def test_decode_sized_products_may_take_threads_and_tiny_ones_never():
    # SmolLM2's one-token 576 x 576 projections are candidates (thread_choice then picks the faster way);
    # its 192 x 576 K/V ones, 15 us on one core, stay on the calling thread; BIG is over the bound
    assert BIG[0] * BIG[1] >= 576 * 576 >= qmm.PARALLEL_MIN_MACS > 192 * 576


@pytest.mark.parametrize("w_type", LEGACY + KQUANTS + FLOATS)
def test_parallel_and_serial_kernels_agree_bit_for_bit(w_type):
    q, _ = weight(w_type, *BIG, seed=12)
    pw = qmm.pack_weight(q, w_type)
    x = activations(1, BIG[1], seed=13)
    a = np.full((1, BIG[0]), np.nan, np.float32)
    b = np.full((1, BIG[0]), np.nan, np.float32)
    pw.parallel(*kernel_args(pw, x), a)
    pw.serial(*kernel_args(pw, x), b)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(run(pw, x), a)


@pytest.mark.parametrize("w_type", ["Q4_0", "Q4_K", "F16"])
def test_thread_count_does_not_change_results(w_type):
    q, _ = weight(w_type, *BIG, seed=9)
    pw = qmm.pack_weight(q, w_type)
    x = activations(1, BIG[1])
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run(pw, x)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = run(pw, x)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, many)


def test_weights_smaller_than_one_tile():
    q, wd = weight("Q4_K", 5, 256)
    x = activations(2, 256)
    got = run(qmm.pack_weight(q, "Q4_K"), x)
    bound = x_error_bound_q8_K(x) @ np.abs(wd).T + accumulation_slack(np.abs(wd), np.abs(x), 16)
    assert np.all(np.abs(got - x.astype(np.float64) @ wd.T) <= bound)


# ------------------------------------------------------------------------------ float weights
@pytest.mark.parametrize("n", TOKENS)
def test_f32_weights(n):
    rng = np.random.default_rng(10)
    w = rng.standard_normal((ROWS, 200)).astype(np.float32)
    x = activations(n, 200)
    got = run(qmm.pack_weight(w, "F32"), x)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.all(np.abs(got - exact) <= accumulation_slack(np.abs(w), np.abs(x), 200))


@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("w_type, rel", [("F16", 2.0 ** -11), ("BF16", 2.0 ** -8)])
def test_half_weights_take_activations_rounded_to_their_type(w_type, rel, n):
    k = 160
    q, wd = weight(w_type, ROWS, k)
    x = activations(n, k)
    got = run(qmm.pack_weight(q, w_type), x)
    exact = x.astype(np.float64) @ wd.T
    ebound = rel * np.abs(x.astype(np.float64)) + 2.0 ** -25       # RNE to the type, f16 subnormals
    bound = ebound @ np.abs(wd).T + accumulation_slack(np.abs(wd), np.abs(x) + ebound, k)
    assert np.all(np.abs(got - exact) <= bound)


def test_float_weights_accept_their_element_arrays_and_keep_them_in_place():
    w = np.random.default_rng(11).standard_normal((40, 64)).astype(np.float16)
    x = activations(2, 64)
    from_elements = qmm.pack_weight(w, "F16")
    from_bytes = qmm.pack_weight(w.view(np.uint8), "F16")
    assert np.shares_memory(from_elements.arrays[0], w)
    np.testing.assert_array_equal(run(from_elements, x), run(from_bytes, x))


# ------------------------------------------------------------------------------ the interface
def test_supported_types_cover_every_gguf_weight_type_with_a_kernel():
    assert set(LEGACY + KQUANTS + FLOATS) <= qmm.SUPPORTED_TYPES


def test_out_that_is_not_contiguous_is_filled():
    q, _ = weight("Q8_0", 64, 64)
    pw = qmm.pack_weight(q, "Q8_0")
    x = activations(3, 64)
    big = np.zeros((3, 128), np.float32)
    qmm.mul_mat(pw, x, big[:, ::2])
    np.testing.assert_array_equal(big[:, ::2], run(pw, x))
    assert not big[:, 1::2].any()


def test_unsupported_type_is_refused_with_the_supported_list():
    with pytest.raises(BackendError, match="Q4_K"):
        qmm.pack_weight(np.zeros((2, 18), np.uint8), "NO_SUCH_TYPE")


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ShapeError, match="18-byte blocks"):
        qmm.pack_weight(np.zeros((2, 20), np.uint8), "Q4_0")


def test_activations_of_the_wrong_width_are_refused():
    q, _ = weight("Q4_0", 8, 64)
    pw = qmm.pack_weight(q, "Q4_0")
    with pytest.raises(ShapeError, match="64"):
        qmm.mul_mat(pw, np.zeros((1, 32), np.float32), np.zeros((1, 8), np.float32))
    with pytest.raises(ShapeError, match="out"):
        qmm.mul_mat(pw, np.zeros((1, 64), np.float32), np.zeros((1, 9), np.float32))


def test_kernels_are_cached_on_disk():
    """Every driver is @njit(cache=True): a cold compile costs seconds per kernel, a cache load ms."""
    from numba.core.caching import NullCache
    from ggflow.backends_builtin.cpu.products.qmm import floats as flt
    kernels = [tmpl._mul_mat_parallel, tmpl._mul_mat_serial, tmpl._mul_mat_tiles, tmpl._mul_mat_quads_parallel,
               tmpl._mul_mat_quads_serial, tmpl._mul_mat_quads_tiles, tmpl._mul_mat_pairs_parallel,
               tmpl._mul_mat_pairs_serial, tmpl._mul_mat_pairs_tiles, flt._mul_mat_parallel, flt._mul_mat_serial,
               act.quantize_q8_0, act.quantize_q8_1, act.quantize_q8_K]
    assert all(not isinstance(k._cache, NullCache) for k in kernels)


SHARED_BODY = """
import numpy as np, ggflow
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
pw = qmm.pack_weight(ggflow.quantize(w, "Q4_0"), "Q4_0")
x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
xq = qmm.quantize_activations(x, pw.vec_dot_type)
for path, tiles in (("tile", tmpl._mul_mat_tiles), ("quads", tmpl._mul_mat_quads_tiles)):
    for parallel in (False, True):
        pw.drivers.get(parallel, path)(pw.kind, pw.arrays, *xq, np.empty((4, 256), np.float32))
    print(path, len(tiles.signatures))
"""


def test_serial_and_parallel_drivers_share_one_compiled_tile_body(tmp_path):
    """The parallel driver calls the serial one's tile-range function with the same argument types (the
    prange index cast to int64), so a type's tile body compiles once for both drivers (docs/performance.md,
    "Compile time of the parallel drivers"). In a process with an empty cache: everything it runs compiles
    there (a driver loaded from the cache carries its callees' code and compiles none)."""
    done = subprocess.run([sys.executable, "-c", SHARED_BODY], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["tile", "1", "quads", "1"]


@pytest.mark.parametrize("w_type", LEGACY + KQUANTS)
def test_packing_in_row_chunks_gives_the_same_arrays(w_type, monkeypatch):
    """Big weights are packed a run of tiles at a time (bounded peak memory): the same bytes."""
    q, _ = weight(w_type, 300, 256, seed=14)
    whole = qmm.pack_weight(q, w_type).arrays
    row_bytes = q.shape[1]
    monkeypatch.setattr(qmm, "PACK_CHUNK_BYTES", 2 * qmm.TILE * row_bytes)   # 300 rows: runs of 128, 128, 44
    runs = []
    chunked = qmm.pack_weight(q, w_type, lambda r0, r1: runs.append((r0, r1))).arrays
    assert runs == [(0, 128), (128, 256), (256, 300)]
    assert len(chunked) == len(whole)
    for a, b in zip(chunked, whole):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
