"""A quantized V cache: V x P reads V through a permuted view whose blocks run along ne[1], not ne[0].

The CPU backend decoded such a view as if its rows were blocks (garbage: "The capital of France is"
answered "------" with type_v Q8_0 or Q4_0). It now decodes the rows of the cache the view spans and
applies the view's strides to the float32 values (TensorArrays.f32_reader).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core import ops
from ggflow.core.quants import dequantize, quantize
from ggflow.core.types import type_traits
from tests.test_cpu_ops import data_of, leaf, randn, run, values


@pytest.mark.parametrize("type_v", ["Q8_0", "Q4_0", "Q5_1"])   # cache types llama.cpp offers
def test_v_x_p_over_a_quantized_cache_view_equals_the_dequantized_product(type_v):
    hd, n_head_kv, n_head, size, n_kv, n_tok = 32, 2, 4, 40, 32, 3   # n_kv: a whole block (the cache pads it)
    v_f = randn(size, hd * n_head_kv)                          # the cache: one row per cell
    cache = leaf(type_v, quantize(v_f, type_v))
    v = ops.view(cache, (hd, n_head_kv, n_kv), (cache.nb[0], cache.type.row_bytes(hd), cache.nb[1]))
    v = ops.permute(v, 1, 2, 0, 3)                             # [n_kv, hd, n_head_kv], as graph_builder reads V
    p = randn(n_head, n_tok, n_kv)                             # [n_kv, n_tok, n_head]
    out = ops.mul_mat(v, leaf("F32", p))                       # [hd, n_tok, n_head]
    run(out)
    v_deq = dequantize(data_of(cache), type_v).astype(np.float64)[:n_kv].reshape(n_kv, n_head_kv, hd)
    dot = type_traits(type_v).vec_dot_type                     # x is rounded to it, as ggml does
    p_q = dequantize(quantize(p.reshape(-1, n_kv), dot), dot)
    p_q = np.asarray(p_q, np.float64).reshape(n_head, n_tok, n_kv)
    expected = np.stack([p_q[h] @ v_deq[:, h // (n_head // n_head_kv), :] for h in range(n_head)])
    np.testing.assert_allclose(values(out), expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def default_llm_tokens():
    from ggflow.api import LLM, default_model_path

    def greedy(type_k: str, type_v: str) -> list[int]:
        llm = LLM(default_model_path(), type_k=type_k, type_v=type_v, n_ctx=64, n_threads=2, backend="cpu")
        return llm.generate("The capital of France is", max_tokens=4, temperature=0).tokens
    return greedy


@pytest.mark.parametrize("type_k, type_v", [("F16", "Q8_0"), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0")])
def test_a_quantized_v_cache_gives_the_f16_cache_greedy_tokens(default_llm_tokens, type_k, type_v):
    reference = default_llm_tokens("F16", "F16")          # " Paris.\n\n"
    assert default_llm_tokens(type_k, type_v) == reference
