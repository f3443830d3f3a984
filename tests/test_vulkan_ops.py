"""The Vulkan backend's ops (everything but mul_mat), each against the CPU backend on random inputs.

Every test also asserts the op ran on Vulkan: a node Vulkan refused would run on the CPU and compare
equal to itself. Tolerances are relative to the largest reference value: 1e-5 for F32 math (float32
rounding and a different summation order: the CPU sums rows in double, the shaders in a float tree),
exact for copies (F32 -> F16 too: the shaders round to nearest even as numpy does) and for get_rows
(dequantization is exact arithmetic), one F16 ulp (2**-10) where a computed result is rounded to F16 (the
shader and numpy may round a value that sits on a rounding boundary differently after a last-bit
difference in float32).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core import ops
from ggflow.core.quants import quantize
from tests.vulkan_harness import assert_close, on_vulkan_and_cpu, requires_vulkan

pytestmark = requires_vulkan

F32_REL = 1e-5
F16_REL = 2.0 ** -10
rng = np.random.default_rng(7)


def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check(build, inputs, op: str, rel: float) -> None:
    vk, cpu = on_vulkan_and_cpu(build, inputs)
    assert op in vk.ops_on("vulkan"), f"{op} did not run on vulkan: {vk.ops_on('cpu')} ran on the cpu"
    for got, want in zip(vk.outputs, cpu.outputs):
        assert_close(got, want, rel)


# -- elementwise ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("b_shape", [(3, 5, 300), (1, 1, 300), (3, 1, 300), (1, 5, 1), (3, 5, 100)])
def test_add_and_mul_broadcast_b_as_ggml_repeats_it(op, b_shape):
    def build():
        a, b = ops.new_input("F32", (300, 5, 3), "a"), ops.new_input("F32", b_shape[::-1], "b")
        return {"a": a, "b": b}, [getattr(ops, op)(a, b)]
    check(build, {"a": randn(3, 5, 300), "b": randn(*b_shape)}, op, F32_REL)


def test_add_reads_a_permuted_view():
    def build():
        a, b = ops.new_input("F32", (40, 30), "a"), ops.new_input("F32", (30, 40), "b")
        return {"a": a, "b": b}, [ops.add(ops.transpose(a), b)]
    check(build, {"a": randn(30, 40), "b": randn(40, 30)}, "add", F32_REL)


@pytest.mark.parametrize("type_name", ["F32", "F16"])
@pytest.mark.parametrize("op", ["scale", "silu", "gelu"])
def test_unary_ops_in_f32_and_f16(op, type_name):
    x = randn(4, 6, 70, scale=4.0)
    x[0, 0, :6] = [-30.0, -10.0, 10.0, 12.0, 0.0, 95.0]   # gelu's linear and zero ranges, silu's exp overflow

    def build():
        a = ops.new_input(type_name, (70, 6, 4), "a")
        return {"a": a}, [ops.scale(a, 0.75, 0.5) if op == "scale" else getattr(ops, op)(a)]
    check(build, {"a": x}, op, F16_REL if type_name == "F16" or op == "gelu" else F32_REL)


# -- normalization -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["rms_norm", "norm"])
@pytest.mark.parametrize("ne0", [64, 300, 4096])
def test_norms_over_rows(op, ne0):
    def build():
        x = ops.new_input("F32", (ne0, 5, 2), "x")
        return {"x": x}, [getattr(ops, op)(x, 1e-6)]
    check(build, {"x": randn(2, 5, ne0, scale=3.0) + 1.0}, op, F32_REL)


@pytest.mark.parametrize("mask_type", [None, "F32", "F16"])
def test_soft_max_scales_masks_and_normalizes_rows(mask_type):
    n_kv, n_tok, heads = 300, 7, 4
    mask = np.where(np.arange(n_kv)[None, :] <= np.arange(n_tok)[:, None] + 290, 0.0, -np.inf)
    mask = np.concatenate([mask, np.zeros((2, n_kv))]).astype(np.float32)   # padding rows are not read

    def build():
        s = ops.new_input("F32", (n_kv, n_tok, heads), "s")
        if mask_type is None:
            return {"s": s}, [ops.soft_max(s, None, 0.125)]
        m = ops.new_input(mask_type, (n_kv, n_tok + 2), "m")
        return {"s": s, "m": m}, [ops.soft_max(s, m, 0.125)]
    check(build, {"s": randn(heads, n_tok, n_kv, scale=8.0), "m": mask}, "soft_max", F32_REL)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the CPU's NaN row
def test_soft_max_of_a_fully_masked_row_is_nan_as_in_ggml():
    mask = np.zeros((3, 16), np.float32)
    mask[1] = -np.inf

    def build():
        s, m = ops.new_input("F32", (16, 3), "s"), ops.new_input("F32", (16, 3), "m")
        return {"s": s, "m": m}, [ops.soft_max(s, m)]
    vk, cpu = on_vulkan_and_cpu(build, {"s": randn(3, 16), "m": mask})
    assert np.isnan(vk.outputs[0][1]).all() and not np.isnan(vk.outputs[0][[0, 2]]).any()


# -- rope ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [ops.ROPE_NORMAL, ops.ROPE_NEOX])
@pytest.mark.parametrize("n_dims", [64, 32])
def test_rope_turns_pairs_by_position(mode, n_dims):
    positions = np.array([0, 1, 5, 17, 128, 1000, 4095], np.int32)

    def build():
        q, p = ops.new_input("F32", (64, 4, 7), "q"), ops.new_input("I32", (7,), "p")
        return {"q": q, "p": p}, [ops.rope(q, p, n_dims, mode, freq_base=10000.0)]
    check(build, {"q": randn(7, 4, 64), "p": positions}, "rope", F32_REL)


def test_rope_with_freq_factors_and_yarn():
    def build():
        q, p = ops.new_input("F32", (32, 2, 5), "q"), ops.new_input("I32", (5,), "p")
        ff = ops.new_input("F32", (16,), "ff")
        return {"q": q, "p": p, "ff": ff}, [ops.rope(q, p, 32, ops.ROPE_NEOX, freq_base=500000.0, freq_scale=0.25,
                                                     n_ctx_orig=4096, ext_factor=1.0, attn_factor=1.0,
                                                     freq_factors=ff)]
    inputs = {"q": randn(5, 2, 32), "p": np.array([0, 3, 70, 900, 2000], np.int32),
              "ff": (1.0 + rng.random(16) * 7).astype(np.float32)}
    check(build, inputs, "rope", F32_REL)


def test_rope_of_f16_keys_gives_f16():
    def build():
        k = ops.new_input("F16", (64, 2, 6), "k")
        p = ops.new_input("I32", (6,), "p")
        return {"k": k, "p": p}, [ops.rope(k, p, 64, ops.ROPE_NEOX)]
    check(build, {"k": randn(6, 2, 64), "p": np.arange(6, dtype=np.int32) * 11}, "rope", F16_REL)


# -- data movement -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                       "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_get_rows_dequantizes_rows_of_every_weight_type(type_name):
    rows, ne0 = 40, 512
    table = randn(rows, ne0)
    data = table if type_name in ("F32", "F16") else quantize(table, type_name)
    ids = np.array([3, 0, 39, 7, 3], np.int32)

    def build():
        from ggflow.core.types import type_traits
        t = type_traits(type_name)
        e = ops.new_input(t, (ne0, rows), "e")
        i = ops.new_input("I32", (5,), "i")
        return {"e": e, "i": i}, [ops.get_rows(e, i)]
    check(build, {"e": data, "i": ids}, "get_rows", 0.0)


def test_get_rows_in_batches():
    def build():
        e, i = ops.new_input("F32", (16, 10, 3), "e"), ops.new_input("I32", (4, 3), "i")
        return {"e": e, "i": i}, [ops.get_rows(e, i)]
    check(build, {"e": randn(3, 10, 16), "i": rng.integers(0, 10, (3, 4)).astype(np.int32)}, "get_rows", 0.0)


@pytest.mark.parametrize("types", [("F32", "F16"), ("F32", "F32"), ("F16", "F16")])
def test_set_rows_writes_rows_at_ids(types):
    src_type, dst_type = types

    def build():
        cache = ops.new_input(dst_type, (64, 20), "cache")
        src, ids = ops.new_input(src_type, (64, 3), "src"), ops.new_input("I32", (3,), "ids")
        return {"cache": cache, "src": src, "ids": ids}, [ops.set_rows(cache, src, ids)]
    inputs = {"cache": randn(20, 64), "src": randn(3, 64), "ids": np.array([5, 19, 0], np.int32)}
    check(build, inputs, "set_rows", 0.0)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_set_rows_quantizes_into_a_quantized_cache_bit_for_bit(type_name):
    rows = randn(5, 256) * np.exp(randn(5, 1) * 2)
    rows[0, :32] = 0.0                                    # an all-zero block
    rows[1, :32] = np.linspace(-1, 1, 32)                 # ties and exact steps
    rows[2, 40], rows[2, 50] = 3.0, -3.0                  # equal magnitudes: ggml keeps the first

    def build():
        cache = ops.new_input(type_name, (256, 12), "cache")
        src, ids = ops.new_input("F32", (256, 5), "src"), ops.new_input("I32", (5,), "ids")
        return {"cache": cache, "src": src, "ids": ids}, [ops.set_rows(cache, src, ids)]
    inputs = {"cache": quantize(randn(12, 256), type_name), "src": rows,
              "ids": np.array([11, 0, 4, 7, 2], np.int32)}
    check(build, inputs, "set_rows", 0.0)


def test_a_quantized_view_copies_bit_for_bit():
    def build():
        q = ops.new_input("Q8_0", (64, 6, 2), "q")
        d = ops.new_input("Q8_0", (64, 3, 2), "d")
        part = ops.view(q, (64, 3, 2), (q.nb[0], q.nb[1] * 2, q.nb[2]), q.nb[1])   # odd rows of q
        return {"q": q, "d": d}, [ops.cont(part), ops.cpy(part, d)]
    inputs = {"q": quantize(randn(12, 64), "Q8_0"), "d": quantize(np.zeros((6, 64), np.float32), "Q8_0")}
    check(build, inputs, "cpy", 0.0)


@pytest.mark.parametrize("types", [("F32", "F32"), ("F32", "F16"), ("F16", "F32"), ("F16", "F16")])
def test_cont_of_a_permuted_view_and_cpy_between_types(types):
    a_type, d_type = types

    def build():
        a = ops.new_input(a_type, (24, 10, 3), "a")
        d = ops.new_input(d_type, (10, 24, 3), "d")
        t = ops.transpose(a)
        return {"a": a, "d": d}, [ops.cont(t), ops.cpy(t, d)]
    inputs = {"a": randn(3, 10, 24), "d": np.zeros((3, 24, 10), np.float32)}
    check(build, inputs, "cpy", 0.0)


def test_cpy_may_reshape_when_element_counts_match():
    def build():
        a, d = ops.new_input("F32", (12, 10), "a"), ops.new_input("F16", (30, 4), "d")
        return {"a": a, "d": d}, [ops.cpy(ops.transpose(a), d)]
    check(build, {"a": randn(10, 12), "d": np.zeros((4, 30), np.float32)}, "cpy", 0.0)


def test_f16_stores_round_to_nearest_even_bit_for_bit():
    """The shaders round to F16 in their own integer arithmetic (common.glsl's round_f16), since a driver may
    drop a float -> half -> float round trip (NVIDIA's did) or convert with another rounding: ties, half
    subnormals, the overflow threshold and signed zeros, against numpy, through cpy and set_rows."""
    tie, sub = 2.0 ** -11, 2.0 ** -24
    special = [1 + tie, 1 + 3 * tie, -(1 + tie), 65504, 65519.99, 65520, 1e6, -1e6, 2 ** -14, 2 ** -14 - sub / 2,
               sub, sub / 2, 1.5 * sub, 2.5 * sub, sub / 4, 1e-10, -0.0, 0.0, np.inf, -np.inf]
    x = np.concatenate([special, randn(256 - len(special)) * np.exp(randn(256 - len(special)) * 6)])
    x = x.astype(np.float32).reshape(4, 64)

    def build():
        a, d = ops.new_input("F32", (64, 4), "a"), ops.new_input("F16", (64, 4), "d")
        cache, ids = ops.new_input("F16", (64, 6), "cache"), ops.new_input("I32", (4,), "ids")
        return {"a": a, "d": d, "cache": cache, "ids": ids}, [ops.cpy(a, d), ops.set_rows(cache, a, ids)]
    inputs = {"a": x, "d": np.zeros((4, 64), np.float32), "cache": np.zeros((6, 64), np.float32),
              "ids": np.array([0, 1, 2, 3], np.int32)}
    vk, _ = on_vulkan_and_cpu(build, inputs)
    assert {"cpy", "set_rows"} <= set(vk.ops_on("vulkan"))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    for got in (vk.outputs[0], vk.outputs[1][:4]):
        np.testing.assert_array_equal(np.asarray(got, np.float32).view(np.uint32), want.view(np.uint32))
