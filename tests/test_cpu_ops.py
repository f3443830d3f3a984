"""The CPU backend's kernels, each against a numpy expression of the same math.

Tolerances: F32 results are compared with float64 references at rtol ~1e-5 (float32 rounding and a
different summation order; rms_norm and the copies are exact); F16 results at one F16 ulp (rtol 2**-10),
since they are computed in float32 and rounded once to half precision. rope's angle is built by
repeated float32 multiplication, as ggml builds it, so it drifts from the float64 angle by a few ulps
of p * theta: about 1e-5 at the positions used here (< 130), checked at atol 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.backends_builtin.cpu.products.matmul import load_quant_matmul
from ggflow.backends_builtin.cpu.ops.rope import rope_cache
from ggflow.backends_builtin.cpu.threads import PARALLEL_MIN_ELEMENTS
from ggflow.core import ops
from ggflow.core.backend import BackendOptions, HostBuffer
from ggflow.core.graph import Graph
from ggflow.core.quants import dequantize, quantize
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import BackendError
from ggflow.plugins.hookspecs import hookimpl
from ggflow.plugins.manager import get_plugin_manager
from ggflow.quant_builtin.float import fp32_to_bf16_bits

F16_RTOL = 2.0 ** -10
rng = np.random.default_rng(1234)


# -- helpers -------------------------------------------------------------------------------------
def allocate(t: Tensor) -> Tensor:
    t.buffer, t.offset = HostBuffer.allocate(max(t.nbytes, 1)), 0
    return t


def leaf(type_name: str, data: np.ndarray, name: str = "", flags: int = 0) -> Tensor:
    """A tensor with its own host memory holding data (numpy axis order; bytes for blocked types)."""
    traits = type_traits(type_name)
    ne = data.shape[::-1] if not traits.is_quantized else (
        data.shape[-1] // traits.type_size * traits.block_size, *data.shape[-2::-1])
    t = allocate(Tensor(traits, ne, name=name, flags=flags))
    t.numpy()[...] = data.reshape(t.numpy().shape)
    return t


def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def run(*outputs: Tensor, backend: CPUBackend | None = None) -> Graph:
    """Give every non-view tensor of the graph its own memory, then compute it on the CPU backend."""
    graph = Graph(outputs)
    for t in (*graph.leafs, *graph.nodes):
        if t.view_src is None and t.buffer is None:
            allocate(t)
    (backend or CPUBackend()).compute(graph.nodes)
    return graph


def data_of(t: Tensor) -> np.ndarray:
    """A tensor's memory in numpy axis order, without the outer size-1 axes (ggml's trailing 1-dims)."""
    a = t.numpy()
    return a.reshape(a.shape[4 - t.n_dims:])


def values(t: Tensor) -> np.ndarray:
    return data_of(t).astype(np.float64)


# -- add, mul ------------------------------------------------------------------------------------
@pytest.mark.parametrize("op, fn", [(ops.add, np.add), (ops.mul, np.multiply)])
@pytest.mark.parametrize("b_shape", [(4, 6, 8), (1, 1, 8), (2, 3, 4), (4, 1, 1), (1, 6, 1)])
def test_binary_ops_repeat_b_over_a_by_tiling(op, fn, b_shape):
    a_np, b_np = randn(4, 6, 8), randn(*b_shape)
    out = op(leaf("F32", a_np), leaf("F32", b_np))
    run(out)
    tiled = np.tile(b_np, [an // bn for an, bn in zip(a_np.shape, b_shape)])
    np.testing.assert_array_equal(data_of(out), fn(a_np, tiled))


def test_add_reads_a_transposed_view():
    a = leaf("F32", randn(6, 5))
    at = ops.transpose(a)                      # [6, 5] -> numpy (5, 6), not contiguous
    b_np = randn(1, 6)
    out = ops.add(at, leaf("F32", b_np))
    run(out)
    np.testing.assert_array_equal(data_of(out), data_of(a).T + b_np)


def test_f16_binary_op_computes_in_f32_and_rounds_once():
    a_np, b_np = randn(3, 16).astype(np.float16), randn(1, 16)
    out = ops.mul(leaf("F16", a_np), leaf("F32", b_np))
    run(out)
    assert data_of(out).dtype == np.float16
    np.testing.assert_array_equal(data_of(out), (a_np.astype(np.float32) * b_np).astype(np.float16))


def test_bf16_is_computed_through_its_to_float_and_from_float():
    a_bits = fp32_to_bf16_bits(randn(3, 8))
    b_np = randn(8)
    out = ops.add(leaf("BF16", a_bits), leaf("F32", b_np))
    run(out)
    a_np = (a_bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(data_of(out), fp32_to_bf16_bits(a_np + b_np))


# -- scale, silu, gelu ---------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", ["F32", "F16"])
@pytest.mark.parametrize("s, bias", [(0.125, 0.0), (-1.5, 0.25)])
def test_scale_multiplies_and_adds_bias(type_name, s, bias):
    x_np = randn(5, 32).astype(type_traits(type_name).numpy_dtype)
    out = ops.scale(leaf(type_name, x_np), s, bias)
    run(out)
    expected = x_np.astype(np.float64) * s + bias
    rtol = F16_RTOL if type_name == "F16" else 1e-7
    np.testing.assert_allclose(values(out), expected, rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("type_name", ["F32", "F16"])
def test_silu(type_name):
    x_np = randn(4, 64, scale=4.0).astype(type_traits(type_name).numpy_dtype)
    out = ops.silu(leaf(type_name, x_np))
    run(out)
    x = x_np.astype(np.float64)
    rtol = F16_RTOL if type_name == "F16" else 1e-6
    np.testing.assert_allclose(values(out), x / (1 + np.exp(-x)), rtol=rtol, atol=1e-7)


# ggml (and we) evaluate 1 + tanh(...) in float32, which cancels for x below about -3: an absolute
# error of up to |x| * 2**-24 where gelu is nearly 0.
GELU_ATOL = 1e-6


def _gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))


def test_gelu_f32_uses_ggml_f16_table_and_clamps():
    # ggml's CPU gelu (GGML_GELU_FP16) rounds x to F16 and returns the F16 gelu of that; x itself from
    # 10 up and 0 from -10 down.
    x_np = np.concatenate([randn(200, scale=4.0), np.float32([-12.0, -10.0, 10.0, 11.5, 0.0])])
    out = ops.gelu(leaf("F32", x_np))
    run(out)
    via_f16 = _gelu64(x_np.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
    expected = np.where(x_np >= 10, x_np, np.where(x_np <= -10, 0.0, via_f16))
    np.testing.assert_allclose(values(out), expected, rtol=F16_RTOL, atol=GELU_ATOL)
    assert values(out)[-5:].tolist() == [0.0, 0.0, 10.0, 11.5, 0.0]


def test_gelu_f16():
    x_np = randn(3, 50, scale=3.0).astype(np.float16)
    out = ops.gelu(leaf("F16", x_np))
    run(out)
    np.testing.assert_allclose(values(out), _gelu64(x_np.astype(np.float64)), rtol=F16_RTOL, atol=GELU_ATOL)


# -- rms_norm, norm ------------------------------------------------------------------------------
def _rms_norm64(x, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _norm64(x, eps):
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps)


@pytest.mark.parametrize("op, reference", [(ops.rms_norm, _rms_norm64), (ops.norm, _norm64)])
@pytest.mark.parametrize("type_name", ["F32", "F16"])
def test_norms_over_rows(op, reference, type_name):
    x_np = (randn(2, 3, 96, scale=2.0) + 0.5).astype(type_traits(type_name).numpy_dtype)
    out = op(leaf(type_name, x_np), 1e-5)
    run(out)
    rtol = F16_RTOL if type_name == "F16" else 1e-6
    np.testing.assert_allclose(values(out), reference(x_np.astype(np.float64), 1e-5), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("op, reference", [(ops.rms_norm, _rms_norm64), (ops.norm, _norm64)])
def test_norms_of_large_tensors_run_rows_in_parallel(op, reference):
    x_np = randn(2, 400, 96, scale=2.0)
    out = op(leaf("F32", x_np), 1e-5)
    assert out.nelements >= PARALLEL_MIN_ELEMENTS   # the parallel driver, not the serial one
    run(out)
    np.testing.assert_allclose(values(out), reference(x_np.astype(np.float64), 1e-5), rtol=1e-6, atol=1e-6)


def test_rms_norm_of_a_strided_view_matches_ggml_float_and_double_arithmetic():
    big = leaf("F32", randn(7, 40))
    x = ops.view(big, (32, 7), (4, big.nb[1]), offset=8 * 4)   # 32 of each row's 40, from column 8
    out = ops.rms_norm(x, 1e-6)
    run(out)
    xs = data_of(big)[:, 8:40]
    # ggml: squares in float, summed in double, mean and scale in float: exact.
    mean = ((xs * xs).astype(np.float64).sum(-1) / 32).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(1e-6))
    np.testing.assert_array_equal(data_of(out), xs * scale[:, None])


# -- rope ----------------------------------------------------------------------------------------
def _rope64(x, pos, n_dims, neox, base, freq_scale, ext_factor=0.0, attn_factor=1.0, n_ctx_orig=0,
            beta_fast=32.0, beta_slow=1.0, freq_factors=None):
    """x: (n_tokens, n_head, head_dim) float64 -> rotated, per ggml_rope_ext's definition (YaRN included)."""
    half = n_dims // 2
    k = np.arange(half)
    extrap = pos[:, None] * base ** (-2.0 * k / n_dims)
    if freq_factors is not None:
        extrap = extrap / freq_factors[:half]
    interp = freq_scale * extrap
    theta, mscale = interp, attn_factor
    if ext_factor != 0:
        def corr_dim(beta):
            return n_dims * np.log(n_ctx_orig / (beta * 2 * np.pi)) / (2 * np.log(base))
        low, high = max(0.0, np.floor(corr_dim(beta_fast))), min(n_dims - 1.0, np.ceil(corr_dim(beta_slow)))
        mix = (1 - np.clip((k - low) / max(0.001, high - low), 0, 1)) * ext_factor
        theta = interp * (1 - mix) + extrap * mix
        mscale *= 1 + 0.1 * np.log(1 / freq_scale)
    cos, sin = (np.cos(theta) * mscale)[:, None, :], (np.sin(theta) * mscale)[:, None, :]
    ia, ib = (k, k + half) if neox else (2 * k, 2 * k + 1)
    out = x.copy()
    out[..., ia] = x[..., ia] * cos - x[..., ib] * sin
    out[..., ib] = x[..., ia] * sin + x[..., ib] * cos
    return out


ROPE_CASES = {
    "normal": dict(mode=ops.ROPE_NORMAL, freq_base=10000.0, freq_scale=1.0),
    "neox scaled": dict(mode=ops.ROPE_NEOX, freq_base=500000.0, freq_scale=0.25),
    "partial dims": dict(mode=ops.ROPE_NEOX, freq_base=10000.0, freq_scale=1.0, n_dims=8),
    "yarn": dict(mode=ops.ROPE_NEOX, freq_base=10000.0, freq_scale=0.25, ext_factor=1.0, attn_factor=1.0,
                 n_ctx_orig=64, beta_fast=32.0, beta_slow=1.0),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_modes_and_frequency_parameters(case):
    params = dict(ROPE_CASES[case])
    n_dims = params.pop("n_dims", 16)
    mode = params.pop("mode")
    x_np, pos_np = randn(5, 3, 16), rng.integers(0, 40, 5).astype(np.int32)
    out = ops.rope(leaf("F32", x_np), leaf("I32", pos_np), n_dims, mode, **params)
    run(out)
    expected = _rope64(x_np.astype(np.float64), pos_np, n_dims, mode == ops.ROPE_NEOX,
                       params["freq_base"], params["freq_scale"], **{
                           k: v for k, v in params.items() if k not in ("freq_base", "freq_scale")})
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-4)


def test_rope_of_many_tokens_runs_tokens_in_parallel():
    x_np, pos_np = randn(130, 8, 64), np.arange(130, dtype=np.int32)[::-1].copy()
    out = ops.rope(leaf("F32", x_np), leaf("I32", pos_np), 64, ops.ROPE_NORMAL, freq_base=10000.0)
    assert out.nelements >= PARALLEL_MIN_ELEMENTS
    run(out)
    expected = _rope64(x_np.astype(np.float64), pos_np, 64, False, 10000.0, 1.0)
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-4)


def test_rope_rotation_rounds_like_a_native_ggml_build():
    # GCC fuses ggml's x0*cos - x1*sin into fma(x0, cos, -(x1*sin)): the first product is not rounded.
    x_np, pos_np = randn(20, 4, 32), rng.integers(0, 2000, 20).astype(np.int32)
    out = ops.rope(leaf("F32", x_np), leaf("I32", pos_np), 32, ops.ROPE_NEOX, freq_base=10000.0)
    run(out)
    f = np.float32
    cos, sin = rope_cache(pos_np, np.ones(1, f), False, 32, 0, f(10000), f(1), f(0), f(1), f(32), f(1))
    cos, sin = cos[:, None, :], sin[:, None, :]
    x0, x1 = x_np[..., :16], x_np[..., 16:]
    fused = np.concatenate([(x0.astype(np.float64) * cos - x1 * sin).astype(np.float32),
                            (x0.astype(np.float64) * sin + x1 * cos).astype(np.float32)], axis=-1)
    rounded_twice = np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    np.testing.assert_array_equal(data_of(out), fused)
    assert (fused != rounded_twice).any()   # the check can tell the two apart


def test_rope_freq_factors_divide_the_angles():
    x_np, pos_np = randn(4, 2, 16), np.array([0, 3, 17, 30], dtype=np.int32)
    factors = np.linspace(1.0, 8.0, 8).astype(np.float32)
    out = ops.rope(leaf("F32", x_np), leaf("I32", pos_np), 16, ops.ROPE_NORMAL, freq_base=10000.0,
                   freq_factors=leaf("F32", factors))
    run(out)
    expected = _rope64(x_np.astype(np.float64), pos_np, 16, False, 10000.0, 1.0, freq_factors=factors)
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-4)


def test_rope_on_a_view_of_fused_qkv_and_in_f16():
    # Q's heads are the first 2*8 of each token's 3*2*8 values: a view with a token stride of 48 floats.
    qkv = leaf("F16", randn(3, 48).astype(np.float16))
    q = ops.view(qkv, (8, 2, 3), (2, 16, qkv.nb[1]))
    pos_np = np.array([5, 6, 7], dtype=np.int32)
    out = ops.rope(q, leaf("I32", pos_np), 8, ops.ROPE_NEOX, freq_base=10000.0)
    run(out)
    q_np = data_of(qkv)[:, :16].reshape(3, 2, 8).astype(np.float64)
    expected = _rope64(q_np, pos_np, 8, True, 10000.0, 1.0)
    assert data_of(out).dtype == np.float16
    np.testing.assert_allclose(values(out), expected, rtol=F16_RTOL, atol=2e-3)


# -- soft_max ------------------------------------------------------------------------------------
def _softmax64(w):
    e = np.exp(w - w.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_soft_max_without_mask():
    x_np = randn(2, 3, 4, 20, scale=3.0)
    out = ops.soft_max(leaf("F32", x_np))
    run(out)
    np.testing.assert_allclose(values(out), _softmax64(x_np.astype(np.float64)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mask_type", ["F32", "F16"])
def test_soft_max_scales_adds_a_padded_mask_broadcast_over_heads(mask_type):
    n_kv, n_tokens, n_head = 12, 3, 4
    kq = randn(n_head, n_tokens, n_kv, scale=2.0)
    mask_np = np.where(rng.random((8, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)   # 8 rows: padded
    mask_np[:, 0] = 0.0                                                                 # no row all -inf
    mask_np[:n_tokens, 1] = -0.5
    mask = leaf(mask_type, mask_np.astype(type_traits(mask_type).numpy_dtype))
    out = ops.soft_max(leaf("F32", kq), mask, scale=0.125)
    run(out)
    expected = _softmax64(kq.astype(np.float64) * 0.125 + mask_np[:n_tokens])
    np.testing.assert_allclose(values(out), expected, rtol=1e-6, atol=1e-7)
    assert (data_of(out)[:, mask_np[:n_tokens] == -np.inf] == 0).all()


# -- mul_mat -------------------------------------------------------------------------------------
def test_mul_mat_weight_times_batched_activations():
    w_np, x_np = randn(24, 64), randn(2, 5, 64)
    out = ops.mul_mat(leaf("F32", w_np, flags=TensorFlag.PARAM), leaf("F32", x_np))
    run(out)
    np.testing.assert_allclose(values(out), x_np.astype(np.float64) @ w_np.T.astype(np.float64),
                               rtol=1e-5, atol=1e-5)


def test_mul_mat_broadcasts_kv_heads_over_query_heads_gqa():
    # 2 K heads, 6 query heads: query head h uses K head h // 3 (ggml's i02 = i12 / r2).
    k_np, q_np = randn(2, 7, 16), randn(6, 4, 16)
    out = ops.mul_mat(leaf("F32", k_np), leaf("F32", q_np))
    run(out)
    expected = np.stack([q_np[h] @ k_np[h // 3].T for h in range(6)]).astype(np.float64)
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-5)


def test_mul_mat_f16_cache_view_rounds_activations_to_f16_like_ggml():
    # K cache [head_dim=16, n_kv=10, n_head_kv=2] in F16, read through a view of its first 6 cells.
    cache = leaf("F16", randn(2, 10, 16).astype(np.float16))
    k = ops.view(cache, (16, 6, 2), (2, cache.nb[1], cache.nb[2]))
    q_np = randn(4, 3, 16)
    out = ops.mul_mat(k, leaf("F32", q_np))
    run(out)
    k_np = data_of(cache)[:, :6].astype(np.float64)
    q16 = q_np.astype(np.float16).astype(np.float64)   # ggml converts src1 to F16 (vec_dot_type)
    expected = np.stack([q16[h] @ k_np[h // 2].T for h in range(4)])
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-5)


def test_mul_mat_with_transposed_v_view_and_permuted_activations():
    v = leaf("F32", randn(9, 16))                       # [head_dim=16, n_kv=9]
    vt = ops.transpose(v)                               # [9, 16]: rows of length n_kv, not contiguous
    kq = leaf("F32", randn(3, 9))                       # [n_kv=9, n_tokens=3] ...
    kq_p = ops.permute(ops.reshape(kq, 9, 1, 3), 0, 2, 1, 3)   # ... as a permuted view [9, 3, 1]
    out = ops.mul_mat(vt, kq_p)
    run(out)
    expected = data_of(kq).astype(np.float64) @ data_of(v).astype(np.float64)   # (3, 16)
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-5)


def test_mul_mat_generic_path_rounds_activations_to_q8_0_for_q4_0():
    w_f = randn(8, 64)
    w = leaf("Q4_0", quantize(w_f, "Q4_0"))
    w_view = ops.view(w, w.ne, w.nb)                   # a view never takes the packed-weight path
    x_np = randn(3, 64)
    out = ops.mul_mat(w_view, leaf("F32", x_np))
    run(out)
    x_q8 = dequantize(quantize(x_np, "Q8_0"), "Q8_0").astype(np.float64)
    expected = x_q8 @ dequantize(data_of(w), "Q4_0").astype(np.float64).T
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(load_quant_matmul() is None, reason="quant_matmul (packed-weight kernels) not written yet")
def test_packed_weight_path_agrees_with_generic_path_and_packs_once():
    qm = load_quant_matmul()
    name = "Q8_0" if "Q8_0" in qm.SUPPORTED_TYPES else sorted(qm.SUPPORTED_TYPES)[0]
    traits = type_traits(name)
    w_f = randn(16, 64)
    data = quantize(w_f, name) if traits.is_quantized else w_f.astype(traits.numpy_dtype)
    w = leaf(name, data, flags=TensorFlag.PARAM)
    x = leaf("F32", randn(5, 64))
    fast, generic = ops.mul_mat(w, x), ops.mul_mat(ops.view(w, w.ne, w.nb), x)
    backend = CPUBackend()
    backend.prepare_weight(w)
    run(fast, generic, backend=backend)
    assert len(backend.packed_weights) == 1
    np.testing.assert_allclose(fast.numpy(), generic.numpy(), rtol=1e-4, atol=1e-4)


# -- a quant type only this file knows: the dequantize fallback ----------------------------------
def _tq8_to_float(blocks: np.ndarray) -> np.ndarray:
    scale = blocks[:, :4].copy().view(np.float32)
    return blocks[:, 4:].view(np.int8).astype(np.float32) * scale


def _tq8_from_float(blocks: np.ndarray) -> np.ndarray:
    scale = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    q = np.round(blocks / np.where(scale == 0, 1, scale)).astype(np.int8)
    return np.concatenate([scale.astype(np.float32).view(np.uint8), q.view(np.uint8)], axis=1)


TQ8 = TypeTraits("TQ8_TEST", 9001, 8, 12, _tq8_to_float, _tq8_from_float, "F32")


class _TestQuantPlugin:
    @hookimpl
    def register_quant_types(self, register):
        register(TQ8)


@pytest.fixture
def tq8():
    manager, plugin = get_plugin_manager(), _TestQuantPlugin()
    manager.register(plugin)
    try:
        yield type_traits("TQ8_TEST")
    finally:
        manager.unregister(plugin)


def test_unknown_quant_type_multiplies_through_its_to_float(tq8):
    w_bytes = quantize(randn(6, 32), tq8)
    w = leaf(tq8.name, w_bytes, flags=TensorFlag.PARAM)
    x_np = randn(2, 32)
    out = ops.mul_mat(w, leaf("F32", x_np))
    run(out)
    expected = x_np.astype(np.float64) @ dequantize(w_bytes, tq8).astype(np.float64).T
    np.testing.assert_allclose(values(out), expected, rtol=1e-5, atol=1e-5)


def test_unknown_quant_type_get_rows_set_rows_and_cpy(tq8):
    table = randn(10, 16)
    emb = leaf(tq8.name, quantize(table, tq8))
    ids = leaf("I32", np.array([7, 0, 7, 3], dtype=np.int32))
    rows = ops.get_rows(emb, ids)
    src = leaf("F32", randn(2, 16))
    cache = leaf(tq8.name, quantize(np.zeros((5, 16), np.float32), tq8))
    written = ops.set_rows(cache, src, leaf("I32", np.array([4, 1], dtype=np.int32)))
    dst = allocate(Tensor(tq8, (16, 2)))
    copied = ops.cpy(src, dst)
    run(rows, written, copied)
    np.testing.assert_array_equal(data_of(rows), dequantize(data_of(emb), tq8)[[7, 0, 7, 3]])
    src_q = quantize(data_of(src), tq8)
    np.testing.assert_array_equal(data_of(cache)[[4, 1]], src_q)
    np.testing.assert_array_equal(data_of(cache)[[0, 2, 3]], quantize(np.zeros((3, 16), np.float32), tq8))
    np.testing.assert_array_equal(data_of(dst), src_q)


# -- get_rows, set_rows, cpy, cont ---------------------------------------------------------------
@pytest.mark.parametrize("type_name", ["F32", "F16", "Q8_0"])
def test_get_rows_dequantizes_the_selected_rows(type_name):
    table = randn(12, 32)
    traits = type_traits(type_name)
    data = quantize(table, type_name) if traits.is_quantized else table.astype(traits.numpy_dtype)
    ids_np = np.array([3, 3, 11, 0, 5], dtype=np.int32)
    out = ops.get_rows(leaf(type_name, data), leaf("I32", ids_np))
    run(out)
    as_f32 = dequantize(data, type_name) if traits.is_quantized else data.astype(np.float32)
    np.testing.assert_array_equal(data_of(out), as_f32[ids_np])


def test_get_rows_batched_ids_pick_from_their_own_matrix():
    a_np = randn(3, 5, 4)                                # a [4, 5 rows, 3 batches]
    ids_np = np.array([[0, 4], [1, 1], [3, 2]], dtype=np.int32)   # ids [2, 3]
    out = ops.get_rows(leaf("F32", a_np), leaf("I32", ids_np))
    run(out)
    expected = np.stack([a_np[b][ids_np[b]] for b in range(3)])
    np.testing.assert_array_equal(data_of(out), expected)


def test_get_rows_rejects_an_id_out_of_range():
    out = ops.get_rows(leaf("F32", randn(4, 8)), leaf("I32", np.array([1, 4], dtype=np.int32)))
    with pytest.raises(BackendError, match="row id 4 is outside 0..3"):
        run(out)


@pytest.mark.parametrize("type_name", ["F32", "F16"])
def test_set_rows_writes_converted_rows_and_leaves_the_rest(type_name):
    dtype = type_traits(type_name).numpy_dtype
    before = randn(6, 8).astype(dtype)
    cache = leaf(type_name, before)
    src_np = randn(2, 8)
    written = ops.set_rows(cache, leaf("F32", src_np), leaf("I32", np.array([5, 2], dtype=np.int32)))
    run(written)
    expected = before.copy()
    expected[[5, 2]] = src_np.astype(dtype)
    np.testing.assert_array_equal(data_of(cache), expected)


def test_cpy_f32_into_a_transposed_f16_destination():
    b = leaf("F16", np.zeros((6, 4), np.float16))      # [4, 6]
    bt = ops.transpose(b)                              # [6, 4], not contiguous
    a_np = randn(4, 6)
    run(ops.cpy(leaf("F32", a_np), bt))
    np.testing.assert_array_equal(data_of(b), a_np.T.astype(np.float16))


def test_cpy_reshapes_in_element_order_and_converts_f16_to_f32():
    a_np = randn(3, 8).astype(np.float16)
    b = leaf("F32", np.zeros((24,), np.float32))
    run(ops.cpy(leaf("F16", a_np), b))
    np.testing.assert_array_equal(b.numpy().reshape(-1), a_np.reshape(-1).astype(np.float32))


def test_cont_makes_a_permuted_view_contiguous():
    a = leaf("F32", randn(2, 3, 4, 5))
    p = ops.permute(a, 2, 0, 1, 3)
    out = ops.cont(p)
    run(out)
    assert out.is_contiguous()
    np.testing.assert_array_equal(data_of(out), data_of(p))
    np.testing.assert_array_equal(data_of(out), data_of(a).transpose(0, 3, 1, 2))


# -- the backend ---------------------------------------------------------------------------------
def test_compiled_plan_reads_inputs_at_run_time():
    x = leaf("F32", randn(2, 8), flags=TensorFlag.INPUT)
    out = ops.rms_norm(ops.scale(x, 2.0), 1e-6)
    graph = run(out)
    plan = CPUBackend(BackendOptions(n_threads=1)).compile(graph.nodes)
    new_x = randn(2, 8)
    x.numpy()[...] = new_x
    plan()
    np.testing.assert_allclose(values(out), _rms_norm64(2.0 * new_x.astype(np.float64), 1e-6), rtol=1e-6)


def test_substitutes_are_read_instead_of_the_source():
    x = leaf("F32", randn(3, 4))
    out = ops.scale(x, 3.0)
    copy = leaf("F32", randn(3, 4))
    allocate(out)
    CPUBackend().compute([out], {x: copy})
    np.testing.assert_array_equal(data_of(out), data_of(copy) * np.float32(3.0))


def test_a_view_of_a_substituted_tensor_reads_the_copy():
    x = leaf("F32", randn(4, 6))
    row2 = ops.view(x, (6,), offset=2 * x.nb[1])
    out = allocate(ops.scale(row2, 2.0))
    copy = leaf("F32", randn(4, 6))
    CPUBackend().compute([row2, out], {x: copy})
    np.testing.assert_array_equal(data_of(out), data_of(copy)[2] * np.float32(2.0))


def test_an_op_without_a_kernel_raises_backend_error_naming_it():
    x = leaf("F32", randn(4))
    node = allocate(Tensor("F32", (4,), op="frobnicate", src=(x,), name="odd"))
    with pytest.raises(BackendError, match="'frobnicate'"):
        CPUBackend().compute([node])


def test_n_threads_must_be_positive():
    with pytest.raises(BackendError, match="n_threads"):
        CPUBackend(BackendOptions(n_threads=0))


def test_registered_as_the_cpu_backend_that_supports_every_op():
    assert get_plugin_manager().backends.get("cpu") is CPUBackend
    assert CPUBackend().supports_op(Tensor("F32", (4,), op="frobnicate"))
