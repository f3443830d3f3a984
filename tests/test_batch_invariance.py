"""Batch invariance: a token's results do not depend on how many tokens were evaluated with it.

Every row of every op must come out bit for bit the same whether its token is alone in the batch or one
of many; otherwise re-evaluating a prompt's last token after a KV-prefix reuse (what the API does when a
prompt is cached) changes greedy answers. The attention mul_mats over the KV cache were the op that
broke it (BLAS's summation order depends on the number of rows), amplified by the F16 rounding of the
softmax probabilities and the Q8 quantization of the attention output.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.api import default_model_path
from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.core import ops
from ggflow.core.backend import HostBuffer
from ggflow.core.batch import Batch
from ggflow.core.context import Context
from ggflow.core.graph import Graph
from ggflow.core.model import Model
from ggflow.core.quants import quantize
from ggflow.core.tensor import Tensor
from ggflow.core.types import type_traits
from ggflow.errors import GGFlowError

# GQA: 3 query heads per K/V head. N_KV spans more than one of the kernel's tiles (256 deep, 64 wide,
# partial ones at the end), and 64 tokens x 3 heads more than one block of rows (128).
HEAD_DIM, N_HEAD, N_HEAD_KV, KV_SIZE, N_KV = 64, 6, 2, 384, 320
BATCH_SIZES = (1, 3, 16, 37, 64)
rng = np.random.default_rng(7)


# -- op level: the attention mul_mats over views of a KV cache ---------------------------------------
def host_leaf(type_name: str, data: np.ndarray) -> Tensor:
    """A leaf in its own host memory; data in numpy axis order (bytes per row for a blocked type)."""
    traits = type_traits(type_name)
    ne = data.shape[::-1] if not traits.is_quantized else (
        data.shape[-1] // traits.type_size * traits.block_size, *data.shape[-2::-1])
    t = Tensor(traits, ne)
    t.buffer, t.offset = HostBuffer.allocate(t.nbytes), 0
    t.numpy()[...] = data.reshape(t.numpy().shape)
    return t


def kv_cache(type_name: str) -> Tensor:
    """[n_embd_kv, kv_size] with random values (cells past N_KV too: a view must not read them)."""
    values = rng.standard_normal((KV_SIZE, N_HEAD_KV * HEAD_DIM)).astype(np.float32)
    if type_name == "F32":
        return host_leaf("F32", values)
    if type_name == "F16":
        return host_leaf("F16", values.astype(np.float16))
    return host_leaf(type_name, quantize(values, type_name))


def cache_view(cache: Tensor) -> Tensor:
    """The first N_KV cells as [head_dim, n_head_kv, n_kv], as graph_builder.attention views K and V."""
    return ops.view(cache, (HEAD_DIM, N_HEAD_KV, N_KV),
                    (cache.nb[0], cache.type.row_bytes(HEAD_DIM), cache.nb[1]))


def keys_times_queries(cache: Tensor, q: np.ndarray) -> Tensor:
    """K x Q; q (n_tokens, n_head, head_dim) -> kq [n_kv, n_tokens, n_head]."""
    keys = ops.permute(cache_view(cache), 0, 2, 1, 3)                          # [hd, n_kv, n_head_kv]
    return ops.mul_mat(keys, ops.permute(host_leaf("F32", q), 0, 2, 1, 3))   # q as [hd, n_tokens, n_head]


def values_times_probabilities(cache: Tensor, p: np.ndarray) -> Tensor:
    """V x P; p (n_head, n_tokens, n_kv) -> kqv [head_dim, n_tokens, n_head]."""
    values = ops.permute(cache_view(cache), 1, 2, 0, 3)                        # [n_kv, hd, n_head_kv]
    return ops.mul_mat(values, host_leaf("F32", p))


def compute(out: Tensor) -> np.ndarray:
    """Run the graph of out on the CPU backend; its rows as (n_head, n_tokens, row length)."""
    graph = Graph([out])
    for t in graph.nodes:
        if t.view_src is None and t.buffer is None:
            t.buffer, t.offset = HostBuffer.allocate(t.nbytes), 0
    CPUBackend().compute(graph.nodes)
    return out.numpy().reshape(out.ne[2], out.ne[1], out.ne[0]).copy()


def queries(n: int) -> np.ndarray:
    return rng.standard_normal((n, N_HEAD, HEAD_DIM)).astype(np.float32)


def probabilities(n: int) -> np.ndarray:
    """Softmax-like rows: positive, summing to 1, with the small values whose F16 rounding matters."""
    e = np.exp(rng.standard_normal((N_HEAD, n, N_KV)) * 3)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def assert_rows_alone_equal_rows_in_batch(batch_rows: np.ndarray, row_alone) -> None:
    """batch_rows (n_head, n, m); row_alone(t) -> (n_head, 1, m), the same token computed alone."""
    for t in range(batch_rows.shape[1]):
        np.testing.assert_array_equal(batch_rows[:, t:t + 1], row_alone(t), err_msg=f"token {t}")


@pytest.mark.parametrize("n", BATCH_SIZES)
@pytest.mark.parametrize("cache_type", ["F16", "F32", "Q8_0"])
def test_keys_times_queries_rows_do_not_depend_on_the_batch(cache_type, n):
    cache, q = kv_cache(cache_type), queries(n)
    in_batch = compute(keys_times_queries(cache, q))
    assert_rows_alone_equal_rows_in_batch(in_batch, lambda t: compute(keys_times_queries(cache, q[t:t + 1])))


@pytest.mark.parametrize("n", BATCH_SIZES)
@pytest.mark.parametrize("cache_type", ["F16", "F32"])
def test_values_times_probabilities_rows_do_not_depend_on_the_batch(cache_type, n):
    cache, p = kv_cache(cache_type), probabilities(n)
    in_batch = compute(values_times_probabilities(cache, p))
    assert_rows_alone_equal_rows_in_batch(
        in_batch, lambda t: compute(values_times_probabilities(cache, np.ascontiguousarray(p[:, t:t + 1]))))


@pytest.mark.parametrize("cache_type", ["F16", "F32"])
def test_attention_mul_mats_match_float64_and_round_activations_to_f16_for_an_f16_cache(cache_type):
    """Invariance alone would also hold for a wrong kernel: check the values, GQA head mapping included."""
    cache, q, p = kv_cache(cache_type), queries(5), probabilities(5)
    kv = cache.numpy().reshape(KV_SIZE, -1)[:N_KV].astype(np.float64).reshape(N_KV, N_HEAD_KV, HEAD_DIM)
    if cache_type == "F16":   # ggml's vec_dot_type for F16 is F16: the activations are rounded first
        q, p = q.astype(np.float16).astype(np.float32), p.astype(np.float16).astype(np.float32)
    group = N_HEAD // N_HEAD_KV
    kq_ref = np.stack([q[:, h].astype(np.float64) @ kv[:, h // group].T for h in range(N_HEAD)])
    kqv_ref = np.stack([p[h].astype(np.float64) @ kv[:, h // group] for h in range(N_HEAD)])
    np.testing.assert_allclose(compute(keys_times_queries(cache, q)), kq_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compute(values_times_probabilities(cache, p)), kqv_ref, rtol=1e-5, atol=1e-6)


# -- model level: the last token alone after a cached prefix gives the batch's logits ----------------
# SmolLM2's chat prompt for "What is the capital of France?" behind a system prompt (37 tokens).
CHAT_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
               19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
# Prompt lengths at which attention summed by BLAS (the kernel before this test) gave the last token other
# logits alone than in its batch, on the tiny model (F16: 131, F32: 44): a flip is rare in a model this
# small, so other lengths would not tell the two kernels apart. Token by token catches it more often.
TINY_LENGTHS = (44, 131)
TINY_TOKEN_BY_TOKEN = 160


def last_logits_one_batch(model: Model, tokens: list[int], cache_type: str) -> np.ndarray:
    ctx = Context(model, n_ctx=256, backends="cpu", type_k=cache_type, type_v=cache_type)
    assert ctx.decode(Batch.from_tokens(tokens)) == 0
    return ctx.get_logits()[-1].copy()


def last_logits_after_cached_prefix(model: Model, tokens: list[int], cache_type: str) -> np.ndarray:
    ctx = Context(model, n_ctx=256, backends="cpu", type_k=cache_type, type_v=cache_type)
    assert ctx.decode(Batch.from_tokens(tokens[:-1])) == 0
    assert ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(tokens) - 1)) == 0
    return ctx.get_logits()[-1].copy()


@pytest.fixture(scope="module")
def tiny_llama_q8(tiny_model_path):
    return Model.load(tiny_model_path("llama", "Q8_0"))


@pytest.fixture(scope="module")
def tiny_prompt(tiny_llama_q8):
    return np.random.default_rng(0).integers(0, tiny_llama_q8.hparams.n_vocab, 200).tolist()


@pytest.mark.parametrize("n_tokens", TINY_LENGTHS)
@pytest.mark.parametrize("cache_type", ["F16", "F32"])
def test_tiny_model_last_token_alone_gives_the_batch_logits_bit_for_bit(tiny_llama_q8, tiny_prompt, cache_type,
                                                                         n_tokens):
    prompt = tiny_prompt[:n_tokens]
    np.testing.assert_array_equal(last_logits_after_cached_prefix(tiny_llama_q8, prompt, cache_type),
                                  last_logits_one_batch(tiny_llama_q8, prompt, cache_type))


@pytest.mark.parametrize("cache_type", ["F16", "F32"])
def test_tiny_model_token_by_token_gives_the_batch_logits_bit_for_bit(tiny_llama_q8, tiny_prompt, cache_type):
    prompt = tiny_prompt[:TINY_TOKEN_BY_TOKEN]
    ctx = Context(tiny_llama_q8, n_ctx=256, backends="cpu", type_k=cache_type, type_v=cache_type)
    ctx.decode(Batch.from_tokens(prompt, all_logits=True))
    in_batch = ctx.get_logits().copy()
    ctx.clear()
    for pos, token in enumerate(prompt):
        ctx.decode(Batch.from_tokens([token], pos0=pos))
        np.testing.assert_array_equal(ctx.get_logits()[-1], in_batch[pos], err_msg=f"position {pos}")


def smollm2_path() -> str:
    try:
        return default_model_path()
    except GGFlowError as exc:
        pytest.skip(f"SmolLM2 is not installed: {exc}")


@pytest.mark.parametrize("cache_type", ["F16", "F32"])
def test_smollm2_last_token_alone_gives_the_batch_logits_bit_for_bit(cache_type):
    model = Model.load(smollm2_path())
    np.testing.assert_array_equal(last_logits_after_cached_prefix(model, CHAT_PROMPT, cache_type),
                                  last_logits_one_batch(model, CHAT_PROMPT, cache_type))
