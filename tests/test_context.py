"""Context.decode and the KV cache: slots, sequences, shifts, a full cache, bad batches."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.batch import Batch, BatchError
from ggflow.core.context import DECODE_NO_KV_SLOT, DECODE_OK, Context
from ggflow.core.model import Model

TOKENS = [5, 17, 42, 100, 7, 3, 250, 12, 9, 77, 31, 64]


@pytest.fixture(scope="module")
def llama(tiny_model_path):
    return Model.load(tiny_model_path("llama"))


def ctx_for(model, n_ctx=64, **kw):
    return Context(model, n_ctx=n_ctx, type_k="F32", type_v="F32", backends="cpu", **kw)


def logits_of(model, tokens, **kw):
    ctx = ctx_for(model, **kw)
    assert ctx.decode(Batch.from_tokens(tokens, all_logits=True)) == DECODE_OK
    return ctx.get_logits().copy()


def close(a, b, tol=1e-4):
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * np.abs(b).max())


def test_a_full_cache_returns_1_and_leaves_the_cache_as_it_was(llama):
    ctx = ctx_for(llama, n_ctx=16)
    assert ctx.decode(Batch.from_tokens(TOKENS[:10])) == DECODE_OK
    before = ctx.memory.cells_snapshot()
    assert ctx.decode(Batch.from_tokens(TOKENS[:8], pos0=10)) == DECODE_NO_KV_SLOT
    assert ctx.memory.cells_snapshot() == before
    assert ctx.decode(Batch.from_tokens(TOKENS[:6], pos0=10)) == DECODE_OK
    assert ctx.n_ctx_used == 16


@pytest.mark.parametrize("batch, message", [
    (Batch.from_tokens([5, 512, 7]), "token id 512 at batch index 1 is outside the vocabulary"),
    (Batch.from_tokens([5, -1]), "token id -1"),
    (Batch(np.array([1, 2, 3]), np.array([0, 2, 3]), 0, True), "increase by one"),
    (Batch.from_tokens([]), "empty"),
    (Batch.from_tokens([1] * 65), "more than the context size 64"),
    (Batch(np.array([1, 2]), np.array([0, 1]), 99, True), "sequence ids"),
])
def test_bad_batches_are_refused_before_anything_changes(llama, batch, message):
    ctx = ctx_for(llama)
    ctx.decode(Batch.from_tokens(TOKENS[:3]))
    before = ctx.memory.cells_snapshot()
    with pytest.raises(BatchError, match=message):
        ctx.decode(batch)
    assert ctx.memory.cells_snapshot() == before


def test_a_batch_must_continue_where_its_sequence_ends(llama):
    ctx = ctx_for(llama)
    ctx.decode(Batch.from_tokens(TOKENS[:4]))
    with pytest.raises(BatchError, match="continue at 4, not 7"):
        ctx.decode(Batch.from_tokens([1], pos0=7))


def test_ubatch_splitting_does_not_change_results(llama):
    close(logits_of(llama, TOKENS, n_ubatch=5), logits_of(llama, TOKENS))


def test_two_sequences_in_one_batch_are_independent(llama):
    a, b = TOKENS[:6], TOKENS[6:]
    batch = Batch(np.array(a + b), np.array(list(range(6)) * 2), np.array([0] * 6 + [1] * 6), True)
    ctx = ctx_for(llama)
    ctx.decode(batch)
    both = ctx.get_logits()
    close(both[:6], logits_of(llama, a))
    close(both[6:], logits_of(llama, b))


def test_seq_rm_then_rewrite_gives_the_same_logits(llama):
    ctx = ctx_for(llama)
    ctx.decode(Batch.from_tokens(TOKENS[:8]))
    ctx.memory.seq_rm(0, 5, -1)
    assert ctx.memory.seq_pos_max(0) == 4
    ctx.decode(Batch.from_tokens(TOKENS[5:10], pos0=5, all_logits=True))
    close(ctx.get_logits(), logits_of(llama, TOKENS[:10])[5:])


def test_seq_cp_shares_a_prefix_between_sequences(llama):
    ctx = ctx_for(llama)
    ctx.decode(Batch.from_tokens(TOKENS[:6]))
    ctx.memory.seq_cp(0, 1)
    used = ctx.n_ctx_used
    ctx.decode(Batch.from_tokens(TOKENS[6:9], pos0=6, seq_id=1, all_logits=True))
    assert ctx.n_ctx_used == used + 3  # the prefix cells are shared, not copied
    close(ctx.get_logits(), logits_of(llama, TOKENS[:9])[6:])


def test_seq_keep_forgets_other_sequences(llama):
    ctx = ctx_for(llama)
    ctx.decode(Batch(np.array(TOKENS[:4] * 2), np.array(list(range(4)) * 2), np.array([0] * 4 + [1] * 4), True))
    ctx.memory.seq_keep(1)
    assert ctx.memory.seq_pos_max(0) == -1 and ctx.memory.seq_pos_max(1) == 3 and ctx.n_ctx_used == 4


def test_seq_add_shifts_positions_and_rerotates_cached_keys(llama):
    """RoPE attention sees only relative positions, so tokens evaluated at 10..15 and shifted to 0..5
    must continue exactly like tokens evaluated at 0..5: only if the cached keys were re-rotated."""
    ctx = ctx_for(llama)
    ctx.decode(Batch(np.array(TOKENS[:6]), np.arange(10, 16), 0, False))
    ctx.memory.seq_add(0, 10, -1, -10)
    assert ctx.memory.seq_pos_min(0) == 0 and ctx.memory.seq_pos_max(0) == 5
    ctx.decode(Batch.from_tokens(TOKENS[6:8], pos0=6, all_logits=True))
    close(ctx.get_logits(), logits_of(llama, TOKENS[:8])[6:], tol=1e-4)


def test_seq_add_on_a_model_without_rope_is_refused(tiny_model_path):
    from ggflow.errors import GGFlowError
    ctx = ctx_for(Model.load(tiny_model_path("gpt2")))
    ctx.decode(Batch.from_tokens(TOKENS[:4]))
    with pytest.raises(GGFlowError, match="no RoPE"):
        ctx.memory.seq_add(0, 0, -1, 2)


def test_decode_reuses_its_graph_while_the_shape_repeats(llama):
    ctx = ctx_for(llama, n_ctx=512)
    ctx.decode(Batch.from_tokens(TOKENS[:4]))
    for i in range(20):
        ctx.decode(Batch.from_tokens([TOKENS[i % 12]], pos0=4 + i))
    assert (ctx.n_graph_builds, ctx.n_graph_reuses) == (2, 19)


def test_graphs_of_recent_shapes_are_kept_and_run_again_after_others_used_the_buffers(llama):
    # a serving loop's pattern: two sequences decoding, a step that also carries a prompt, decoding again
    def run(ctx):
        out, pos = [], {0: 8, 1: 8}    # two 8-token prompts first: the largest graph sizes the buffers
        ctx.decode(Batch(np.array(TOKENS[:8] * 2), np.array(list(range(8)) * 2), np.repeat([0, 1], 8),
                         np.ones(16, bool)))
        for step in range(6):
            seqs = sorted(pos)
            tokens, positions, ids = [TOKENS[step]] * len(seqs), [pos[q] for q in seqs], seqs
            if step == 3:   # sequence 2's prompt joins the step (its first token comes later)
                tokens, positions, ids = tokens + TOKENS[3:8], positions + [0, 1, 2, 3, 4], ids + [2] * 5
            assert ctx.decode(Batch(np.array(tokens), np.array(positions), np.array(ids),
                                    np.ones(len(tokens), bool))) == DECODE_OK
            out.append(ctx.get_logits().copy())
            pos = {q: p + 1 for q, p in pos.items()}
        return out

    kept = ctx_for(llama, n_ctx=512)
    got = run(kept)
    # shapes (tokens, outputs): (16, 16), (2, 2) x3, (7, 7), (2, 2) x2: each built once
    assert (kept.n_graph_builds, kept.n_graph_reuses) == (3, 4)
    for a, b in zip(got, run(ctx_for(llama, n_ctx=512))):
        np.testing.assert_array_equal(a, b)
    # one graph kept at a time (each shape built again when it comes back): the same bits
    import ggflow.core.context as context_module
    one = ctx_for(llama, n_ctx=512)
    original, context_module.GRAPHS_KEPT = context_module.GRAPHS_KEPT, 1
    try:
        for a, b in zip(got, run(one)):
            np.testing.assert_array_equal(a, b)
    finally:
        context_module.GRAPHS_KEPT = original
    assert one.n_graph_builds == 4    # (2, 2) built again after (7, 7)


def test_a_kept_graph_whose_buffer_a_larger_graph_replaced_is_built_again(llama):
    ctx = ctx_for(llama, n_ctx=512)
    ctx.decode(Batch.from_tokens(TOKENS[:2]))
    ctx.decode(Batch.from_tokens([TOKENS[2]], pos0=2))            # one token: a small graph
    ctx.decode(Batch.from_tokens(TOKENS * 8, pos0=3))             # 96 tokens: the compute buffer grows
    builds = ctx.n_graph_builds
    ctx.decode(Batch.from_tokens([TOKENS[3]], pos0=99))           # the one-token shape again, a new buffer
    assert ctx.n_graph_builds == builds + 1
    fresh = ctx_for(llama, n_ctx=512)
    fresh.decode(Batch.from_tokens(TOKENS[:2] + [TOKENS[2]] + TOKENS * 8 + [TOKENS[3]], all_logits=True))
    np.testing.assert_array_equal(ctx.get_logits()[-1], fresh.get_logits()[-1])


def test_only_requested_logits_are_returned(llama):
    ctx = ctx_for(llama)
    logits = np.array([False, True, False, True, True])
    ctx.decode(Batch(np.array(TOKENS[:5]), np.arange(5), 0, logits))
    full = logits_of(llama, TOKENS[:5])
    assert ctx.get_logits().shape == (3, llama.hparams.n_vocab)
    close(ctx.get_logits_ith(1), full[1])
    close(ctx.get_logits_ith(-1), full[4])
    with pytest.raises(BatchError, match="did not ask"):
        ctx.get_logits_ith(0)
