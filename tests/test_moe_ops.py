"""The expert-routing ops (mul_mat_id, argsort / top-k, sigmoid, sum_rows, div, clamp, concat) on the CPU
backend, against numpy written from ggml's definitions (ggml.c, ggml-cpu/ops.cpp).

mul_mat_id's reference multiplies each (token, slot) row by the float32 decoding of the chosen expert's
matrix, the activations rounded to the weight type's vec_dot_type first as ggml does: float32 weights agree
to rtol 1e-5 (summation order), quantized ones to a few 1e-4 relative to the row's scale (the kernels' f32
accumulation of per-block integer dots against a float64 reference). Each row must also equal, bit for bit,
what mul_mat gives that row against that expert's matrix alone.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.products import quant_matmul
from ggflow.backends_builtin.cpu.products.matmul import vec_dot_rounding
from ggflow.core import ops
from ggflow.core.quants import dequantize, quantize
from ggflow.core.types import type_traits
from ggflow.errors import ShapeError
from tests.test_cpu_ops import data_of, leaf, randn, run

rng = np.random.default_rng(38)


def expert_weights(type_name: str, n_expert: int, m: int, k: int) -> tuple:
    """(leaf tensor [k, m, n_expert], its float32 values (n_expert, m, k))."""
    w = randn(n_expert, m, k, scale=0.5)
    if type_name == "F32":
        return leaf("F32", w), w
    raw = quantize(w.reshape(-1, k), type_name).reshape(n_expert, m, -1)
    return leaf(type_name, raw), dequantize(raw, type_name).reshape(n_expert, m, k)


def mul_mat_id_reference(w: np.ndarray, x: np.ndarray, ids: np.ndarray, type_name: str) -> np.ndarray:
    """ggml: out[t, e] = w[ids[t, e]] @ x[t, e % n_b], x rounded to the weight's vec_dot_type."""
    n_tokens, n_used = ids.shape
    round_x = vec_dot_rounding(type_traits(type_name), x.shape[-1])
    out = np.empty((n_tokens, n_used, w.shape[1]))
    for t in range(n_tokens):
        for e in range(n_used):
            row = round_x(x[t, e % x.shape[1]][None])[0].astype(np.float64)
            out[t, e] = w[ids[t, e]].astype(np.float64) @ row
    return out


def routed(n_tokens: int, n_used: int, n_expert: int) -> np.ndarray:
    """Each token's n_used distinct experts, as a router's top-k gives them."""
    return np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)]).astype(np.int32)


@pytest.mark.parametrize("type_name", ["F32", "Q8_0", "Q4_K", "MXFP4"])
@pytest.mark.parametrize("n_tokens, n_b", [(1, 1), (7, 1), (7, 2), (33, 2)])
def test_mul_mat_id_multiplies_each_row_by_its_chosen_expert(type_name, n_tokens, n_b):
    n_expert, n_used, m, k = 6, 2, 40, 256
    as_, w = expert_weights(type_name, n_expert, m, k)
    x, ids = randn(n_tokens, n_b, k), routed(n_tokens, n_used, n_expert)
    out = ops.mul_mat_id(as_, leaf("F32", x), leaf("I32", ids))
    assert out.ne[:3] == (m, n_used, n_tokens)
    run(out)
    want = mul_mat_id_reference(w, x, ids, type_name)
    got = data_of(out).reshape(n_tokens, n_used, m)
    tol = 1e-5 if type_name == "F32" else 2e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_mul_mat_id_rows_equal_mul_mat_against_the_expert_alone():
    n_expert, n_used, m, k, n_tokens = 4, 2, 32, 256, 5
    as_, _ = expert_weights("Q4_K", n_expert, m, k)
    x, ids = randn(n_tokens, 1, k), routed(n_tokens, n_used, n_expert)
    out = ops.mul_mat_id(as_, leaf("F32", x), leaf("I32", ids))
    run(out)
    got = data_of(out).reshape(n_tokens, n_used, m)
    raw = as_.numpy().reshape(n_expert, m, -1)
    for e in range(n_expert):
        alone = ops.mul_mat(leaf("Q4_K", raw[e].copy()), leaf("F32", x.reshape(n_tokens, k)))
        run(alone)
        rows = data_of(alone).reshape(n_tokens, m)
        t, slot = np.nonzero(ids == e)
        np.testing.assert_array_equal(got[t, slot], rows[t])


def test_mul_mat_id_reads_each_chosen_expert_once_and_no_other(monkeypatch):
    n_expert, n_used, m, k, n_tokens = 8, 2, 32, 64, 6
    as_, _ = expert_weights("Q8_0", n_expert, m, k)
    ids = np.array([[1, 5], [5, 1], [1, 3], [3, 5], [1, 5], [5, 3]], np.int32)
    calls = []
    real = quant_matmul.PackedWeight.kernel

    def counting(pw, parallel, n_tokens):               # the kernel of each product run
        calls.append((pw, n_tokens))
        return real(pw, parallel, n_tokens)
    monkeypatch.setattr(quant_matmul.PackedWeight, "kernel", counting)
    run(ops.mul_mat_id(as_, leaf("F32", randn(n_tokens, 1, k)), leaf("I32", ids)))
    assert len(calls) == 3                                  # experts 1, 3 and 5: one product each
    assert sorted(n for _, n in calls) == [3, 4, 5]         # their rows all in it
    assert len({id(pw) for pw, _ in calls}) == 3


def test_mul_mat_id_refuses_mismatched_shapes():
    as_ = leaf("F32", randn(4, 8, 16))
    with pytest.raises(ShapeError, match="mul_mat_id"):
        ops.mul_mat_id(as_, leaf("F32", randn(3, 1, 12)), leaf("I32", np.zeros((3, 2), np.int32)))
    with pytest.raises(ShapeError, match="mul_mat_id"):
        ops.mul_mat_id(as_, leaf("F32", randn(3, 1, 16)), leaf("I32", np.zeros((4, 2), np.int32)))
    with pytest.raises(ShapeError, match="mul_mat_id"):
        ops.mul_mat_id(as_, leaf("F32", randn(3, 2, 16)), leaf("I32", np.zeros((3, 3), np.int32)))
    with pytest.raises(ShapeError, match="I32"):
        ops.mul_mat_id(as_, leaf("F32", randn(3, 1, 16)), leaf("F32", np.zeros((3, 2), np.float32)))


def test_argsort_top_k_gives_each_rows_largest_first():
    x = randn(5, 16)
    top = ops.argsort_top_k(leaf("F32", x), 4)
    assert top.type.name == "I32" and top.ne[:2] == (4, 5)
    run(top)
    np.testing.assert_array_equal(data_of(top), np.argsort(-x, axis=-1, kind="stable")[:, :4])


def test_argsort_ascending_and_descending():
    x = randn(3, 2, 9)
    up, down = ops.argsort(leaf("F32", x)), ops.argsort(leaf("F32", x), ops.SORT_DESC)
    run(up, down)
    np.testing.assert_array_equal(data_of(up), np.argsort(x, axis=-1, kind="stable"))
    np.testing.assert_array_equal(np.take_along_axis(x, data_of(down).astype(np.int64), -1),
                                  -np.sort(-x, axis=-1))


def test_argsort_top_k_refuses_k_beyond_the_row():
    with pytest.raises(ShapeError, match="k=9"):
        ops.argsort_top_k(leaf("F32", randn(2, 8)), 9)


def test_sigmoid_clamp_sum_rows_div():
    x, y = randn(4, 8) * 4, np.abs(randn(4, 1)) + 0.5
    a, b = leaf("F32", x), leaf("F32", y)
    sig, cl, sr, dv = ops.sigmoid(a), ops.clamp(a, -1.0, 2.0), ops.sum_rows(a), ops.div(a, b)
    run(sig, cl, sr, dv)
    np.testing.assert_allclose(data_of(sig), 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    np.testing.assert_array_equal(data_of(cl), np.clip(x, -1, 2))
    assert sr.ne[:2] == (1, 4)
    np.testing.assert_array_equal(data_of(sr).ravel(), x.astype(np.float64).sum(-1).astype(np.float32))
    np.testing.assert_allclose(data_of(dv), x / y, rtol=1e-6)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_concat_joins_along_a_dim(dim):
    x = randn(2, 3, 4)
    shape = list(x.shape)
    shape[2 - dim] = 5
    y = randn(*shape)
    out = ops.concat(leaf("F32", x), leaf("F32", y), dim)
    run(out)
    np.testing.assert_array_equal(data_of(out), np.concatenate([x, y], axis=2 - dim))


def test_concat_refuses_other_dims_disagreeing():
    with pytest.raises(ShapeError, match="concat"):
        ops.concat(leaf("F32", randn(2, 3)), leaf("F32", randn(3, 3)), 0)


def test_add_id_adds_each_chosen_experts_bias():
    n, n_expert, n_used, n_tokens = 6, 5, 2, 4
    a, b, ids = randn(n_tokens, n_used, n), randn(n_expert, n), routed(n_tokens, n_used, n_expert)
    out = ops.add_id(leaf("F32", a), leaf("F32", b), leaf("I32", ids))
    run(out)
    np.testing.assert_array_equal(data_of(out), a + b[ids])


def test_soft_max_sinks_counts_each_heads_sink_in_the_sum():
    n_kv, n_tokens, n_head = 7, 3, 4
    x, sinks = randn(n_head, n_tokens, n_kv) * 3, randn(n_head) * 2
    mask = np.zeros((n_tokens, n_kv), np.float32)
    mask[0, 5:] = -np.inf                                   # a causal-like row
    out = ops.soft_max_sinks(leaf("F32", x), leaf("F32", mask), 0.5, leaf("F32", sinks))
    run(out)
    w = x.astype(np.float64) * 0.5 + mask
    logits = np.concatenate([w, np.broadcast_to(sinks[:, None, None], (n_head, n_tokens, 1))], axis=-1)
    e = np.exp(logits - logits.max(-1, keepdims=True))      # HF gpt-oss's: softmax over [w, sink], sink dropped
    np.testing.assert_allclose(data_of(out), (e / e.sum(-1, keepdims=True))[..., :-1], rtol=1e-6, atol=1e-7)


def test_soft_max_sinks_refuses_a_sink_count_other_than_the_heads():
    with pytest.raises(ShapeError, match="one value per head"):
        ops.soft_max_sinks(leaf("F32", randn(4, 3, 7)), None, 1.0, leaf("F32", randn(3)))


def test_mul_mat_id_without_the_packed_kernels_decodes_the_chosen_experts():
    from ggflow.backends_builtin.cpu.backend import CPUBackend
    from ggflow.backends_builtin.cpu.products.matmul import PackedWeights
    n_expert, n_used, m, k, n_tokens = 5, 2, 24, 64, 6
    as_, w = expert_weights("Q8_0", n_expert, m, k)
    x, ids = randn(n_tokens, 1, k), routed(n_tokens, n_used, n_expert)
    out = ops.mul_mat_id(as_, leaf("F32", x), leaf("I32", ids))
    backend = CPUBackend()
    backend._weights = PackedWeights(None)          # as when quant_matmul is not installed
    run(out, backend=backend)
    want = mul_mat_id_reference(w, x, ids, "Q8_0")
    np.testing.assert_allclose(data_of(out).reshape(want.shape), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
