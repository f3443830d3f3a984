"""The CPU's attention skips the cache pages a token cannot see, with the results it had without skipping.

products.fixed_order ("Pages a token cannot see") leaves out the pages the mask hides from a token:
K x Q leaves their scores 0 (the softmax's -inf makes them 0 anyway), V x P their terms (exact zeros).
Checked here bit for bit against the same kernels with nothing skipped, on the kernels and on a model
serving several sequences from one cache (ops/attention_pages.py decides which products may skip).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.ops import attention_pages
from ggflow.backends_builtin.cpu.products import fixed_order
from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK
from tests.test_context import TOKENS, ctx_for, llama  # noqa: F401  (llama: the module's model fixture)

PAGE = fixed_order.PAGE
rng = np.random.default_rng(5)


def test_pages_live_marks_the_pages_with_a_visible_cell_and_every_page_of_a_row_that_sees_none():
    mask = np.full((3, 4 * PAGE), -np.inf, np.float32)
    mask[0, 5] = 0                        # token 0: page 0
    mask[0, 3 * PAGE + PAGE - 1] = 0      # and page 3's last cell
    mask[1, PAGE:2 * PAGE] = 0            # token 1: page 1 whole
    live = np.zeros((3, 4), np.uint8)     # token 2 sees nothing: every page, so its NaN row stays NaN
    fixed_order.pages_live(mask, live)
    assert live.tolist() == [[1, 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 1]]


def _run(a, a_shape, x, live, skip):
    a_mem, steps = fixed_order.as_memory(a)
    out = np.empty((*x.shape[:3], a_shape[2]), np.float32)
    fixed_order.mul_mat_fixed_order_serial(a_mem, a_shape, steps, np.ascontiguousarray(x), out, False, live, skip,
                                           0, fixed_order.n_tasks(a_shape, x.shape))
    return out


@pytest.mark.parametrize("n_tokens", [1, 5])
def test_skipping_gives_the_unskipped_bits_where_the_mask_lets_them_matter(n_tokens):
    n_head, n_head_kv, hd, n_kv = 6, 2, 64, 5 * PAGE          # GQA 3:1, five pages, two depth blocks
    live = (rng.random((n_tokens, n_kv // PAGE)) < 0.5).astype(np.uint8)
    live[:, 0] = 1
    visible = np.repeat(live.astype(bool), PAGE, axis=1)       # (tokens, cells)
    # K x Q: keys (1, n_head_kv, n_kv, hd); the scores of hidden pages are 0, the rest unchanged
    keys = rng.standard_normal((1, n_head_kv, n_kv, hd)).astype(np.float32)
    q = rng.standard_normal((1, n_head, n_tokens, hd)).astype(np.float32)
    full = _run(keys, keys.shape, q, fixed_order.NO_PAGES, fixed_order.NO_SKIP)
    skipped = _run(keys, keys.shape, q, live, fixed_order.SKIP_COLUMNS)
    np.testing.assert_array_equal(skipped[0][:, visible], full[0][:, visible])
    assert (skipped[0][:, ~visible] == 0).all() and (~visible).any()
    # V x P: values seen as (1, n_head_kv, hd, n_kv) with cells along kk; P exactly 0 on hidden pages
    values = rng.standard_normal((1, n_head_kv, n_kv, hd)).astype(np.float32).transpose(0, 1, 3, 2)
    p = rng.random((1, n_head, n_tokens, n_kv)).astype(np.float32) * visible
    np.testing.assert_array_equal(
        _run(values, values.shape, p, live, fixed_order.SKIP_DEPTH),
        _run(values, values.shape, p, fixed_order.NO_PAGES, fixed_order.NO_SKIP))


def _serve(model):
    """Three sequences, prompts then one token each per step, as the serving engine decodes them."""
    ctx = ctx_for(model, n_ctx=4 * PAGE)
    logits = []
    for s in range(3):
        assert ctx.decode(Batch.from_tokens(TOKENS[s:s + 8], seq_id=s)) == DECODE_OK
        logits.append(ctx.get_logits().copy())
    for pos in range(8, 20):
        assert ctx.decode(Batch(np.array(TOKENS[pos % 7:pos % 7 + 3]), np.full(3, pos), np.arange(3), True)) == DECODE_OK
        logits.append(ctx.get_logits().copy())
    return np.concatenate(logits)


@pytest.mark.parametrize("fused", [True, False], ids=["fused attention", "three kernels"])
def test_a_model_serving_several_sequences_gives_the_same_logits_with_and_without_skipping(llama, monkeypatch, fused):
    """Skipping by the fused attention kernel (ops/attention.py) or by the unfused products, against the
    unfused products reading every page."""
    lives = []
    real = fixed_order.pages_live

    def recording(mask, live):
        real(mask, live)
        lives.append(live.copy())
    monkeypatch.setattr(fixed_order, "pages_live", recording)
    if not fused:
        monkeypatch.setattr(attention_pages, "attention_chains", lambda nodes: {})
    skipping = _serve(llama)
    assert any((live == 0).any() for live in lives)     # pages were skipped
    monkeypatch.setattr(attention_pages, "attention_chains", lambda nodes: {})
    monkeypatch.setattr(attention_pages, "masked_products", lambda nodes: {})
    lives.clear()
    np.testing.assert_array_equal(skipping, _serve(llama))
    assert not lives


def test_a_models_attention_runs_as_one_fused_kernel_per_layer(llama):
    """GraphBuilder.attention's nodes come in the order fusion.py looks for (K x Q, soft_max, V x P, cont):
    each layer's attention binds as the one fused kernel, prompt and decode alike."""
    ctx = ctx_for(llama, n_ctx=4 * PAGE)
    for batch in (Batch.from_tokens(TOKENS[:8], seq_id=0), Batch(np.array(TOKENS[8:9]), np.array([8]), 0, True)):
        assert ctx.decode(batch) == DECODE_OK
        kernels = [k for split in ctx.scheduler.splits for k in split.plan.kernels]
        fused = [k for k in kernels if getattr(k, "__qualname__", "").startswith("bind_attention")]
        assert len(fused) == llama.hparams.n_layer
