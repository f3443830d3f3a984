"""The iswa memory (core/kv_cache_iswa.py) against the full cache it replaces: a KVCache that keeps every
cell for every layer and masks the local layers' window.

The tiny llama (2 layers) with layer 0 local, a window of 8 positions, ubatches of 16: the window cache is
padded to 256 cells, so a 600-token sequence wraps it twice. Until the window cache first reuses a cell its
cells are the full cache's and the logits are the same bits; after, the local layer adds the same terms in
another cell order, so they agree to rounding: TOL, relative to the largest logit (measured: 2.8e-7 on one
sequence, 3.2e-7 on three).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_NO_KV_SLOT, DECODE_OK, Context
from ggflow.core.kv_cache import KVCache
from ggflow.core.kv_cache_iswa import IswaCache, window_cache_size
from ggflow.core.memory import SlidingWindow
from ggflow.core.model import Model
from ggflow.errors import BackendError, GGFlowError

N_SWA, N_UBATCH, N_CTX = 8, 16, 1024
WINDOW = SlidingWindow(N_SWA, frozenset({0}))
TOL = 1e-5
TOKENS = np.random.default_rng(0).integers(3, 200, 600).tolist()


def _model(path, kind: str, **iswa) -> Model:
    """The tiny llama with its memory made as kind says: "full" (KVCache + window mask) or "iswa"."""
    model = Model.load(path)

    def create_memory(self, hp, n_ctx, backend, type_k, type_v, n_ubatch):
        if kind == "full":
            return KVCache(hp, n_ctx, backend, type_k, type_v, swa=WINDOW)
        return IswaCache(hp, n_ctx, backend, type_k, type_v, WINDOW, n_ubatch, **iswa)

    arch_class = type(model.arch)
    model.arch = type(f"{kind}{arch_class.__name__}", (arch_class,), {"create_memory": create_memory})()
    return model


@pytest.fixture(scope="module")
def path(tiny_model_path):
    return tiny_model_path("llama")


def _ctx(model, n_ctx=N_CTX):
    return Context(model, n_ctx=n_ctx, n_ubatch=N_UBATCH, type_k="F32", type_v="F32", backends="cpu", n_threads=1)


def _run(ctx, tokens, seq_id=0, pos0=0, step=50) -> np.ndarray:
    """Every token's logits, decoded `step` tokens a batch."""
    out = []
    for i in range(0, len(tokens), step):
        batch = Batch.from_tokens(tokens[i: i + step], pos0=pos0 + i, seq_id=seq_id, all_logits=True)
        assert ctx.decode(batch) == DECODE_OK
        out.append(ctx.get_logits().copy())
    return np.concatenate(out)


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=0, atol=TOL * np.abs(b).max())


def test_the_window_cache_is_sized_as_llama_cpp_sizes_it():
    assert window_cache_size(8192, 512, 512) == 1024                   # gemma3 at llama.cpp's defaults
    assert window_cache_size(8192, 512, 100) == 768                    # padded to 256
    assert window_cache_size(768, 512, 768) == 768                     # never more than n_ctx
    assert window_cache_size(8192, 512, 512, n_seq=4) == 2560          # a window per sequence
    assert window_cache_size(8192, 512, 512, swa_full=True) == 8192


def test_global_layers_keep_n_ctx_cells_and_local_layers_the_window_cache(path):
    memory = _ctx(_model(path, "iswa")).memory
    assert (memory.size, memory.base.size, memory.swa.size) == (N_CTX, N_CTX, 256)
    assert (memory.base.layers, memory.swa.layers) == ((1,), (0,))
    full = _ctx(_model(path, "full")).memory
    per_cell_layer = full.nbytes // (N_CTX * 2)
    assert memory.nbytes == per_cell_layer * (N_CTX + 256) < full.nbytes


def test_with_swa_full_the_logits_are_the_full_caches_bit_for_bit(path):
    full = _run(_ctx(_model(path, "full")), TOKENS)
    np.testing.assert_array_equal(_run(_ctx(_model(path, "iswa", swa_full=True)), TOKENS), full)


def test_the_logits_are_the_same_bits_until_the_window_cache_reuses_a_cell_then_equal_to_rounding(path):
    full = _run(_ctx(_model(path, "full")), TOKENS)
    ctx = _ctx(_model(path, "iswa"))
    iswa = _run(ctx, TOKENS)
    # 250..255 are the window cache's last free cells: the ubatch at 250 (16 tokens) goes to reused cells
    np.testing.assert_array_equal(iswa[:250], full[:250])
    assert (iswa[250:] != full[250:]).any()
    _close(iswa, full)
    assert ctx.memory.swa.n_used <= 256 and ctx.memory.base.n_used == len(TOKENS)
    assert ctx.memory.seq_pos_min(0) > 0 and ctx.memory.seq_pos_max(0) == len(TOKENS) - 1


def test_several_sequences_each_keep_their_window(path):
    runs = {}
    for kind in ("full", "iswa"):
        ctx = _ctx(_model(path, kind))
        logits = {s: [] for s in range(3)}
        for i in range(0, 300, 30):   # the three sequences interleaved, one batch each step
            for s in range(3):
                logits[s].append(_run(ctx, TOKENS[s * 100 + i: s * 100 + i + 30], seq_id=s, pos0=i))
        runs[kind] = {s: np.concatenate(v) for s, v in logits.items()}
    for s in range(3):
        _close(runs["iswa"][s], runs["full"][s])
    alone = _run(_ctx(_model(path, "iswa")), TOKENS[100:400], step=30)
    _close(runs["iswa"][1], alone)


def test_a_seq_rm_that_keeps_the_window_continues_as_the_full_cache(path):
    continued = {}
    for kind in ("full", "iswa"):
        ctx = _ctx(_model(path, kind))
        _run(ctx, TOKENS[:500])
        assert ctx.memory.seq_rm(0, 495, -1) is True   # the window before 495 is still cached
        continued[kind] = _run(ctx, TOKENS[100:150], pos0=495)
    _close(continued["iswa"], continued["full"])


def test_a_seq_rm_past_what_the_window_cache_holds_returns_false_and_changes_nothing(path):
    ctx = _ctx(_model(path, "iswa"))
    _run(ctx, TOKENS[:500])
    before = ctx.memory.cells_snapshot(), ctx.memory.n_used
    assert ctx.memory.seq_rm(0, 100, -1) is False   # position 100's window left the cache long ago
    assert (ctx.memory.cells_snapshot(), ctx.memory.n_used) == before
    assert ctx.memory.seq_rm(0, 0, -1) is True and ctx.memory.n_used == 0
    assert ctx.memory.seq_rm(0, 100, -1) is True    # nothing left to continue: nothing missing


def test_an_exception_mid_batch_rolls_back_even_the_window_rows_a_long_batch_overwrote(path, monkeypatch):
    """A 500-token batch in 16-token ubatches goes round the 256-cell window cache twice, overwriting the
    cells of position 300's window; the failure comes at the 30th ubatch of 32."""
    ctx = _ctx(_model(path, "iswa"))
    _run(ctx, TOKENS[:300])
    base_before, pos_max = ctx.memory.base.cells_snapshot(), ctx.memory.seq_pos_max(0)
    compute, calls = ctx.scheduler.compute, []

    def fail_on_ubatch_30(graph):
        calls.append(1)
        if len(calls) == 30:
            raise BackendError("device lost")
        compute(graph)

    monkeypatch.setattr(ctx.scheduler, "compute", fail_on_ubatch_30)
    with pytest.raises(BackendError, match="device lost"):
        ctx.decode(Batch.from_tokens(TOKENS[:500], pos0=300))
    monkeypatch.undo()
    assert len(calls) == 30
    assert ctx.memory.base.cells_snapshot() == base_before and ctx.memory.seq_pos_max(0) == pos_max
    swa = ctx.memory.swa
    assert set(range(pos_max + 2 - N_SWA, pos_max + 1)) <= set(swa.pos[swa.seq[:, 0]].tolist())
    retried = _run(ctx, TOKENS[300:400], pos0=300)
    full = _ctx(_model(path, "full"))
    _run(full, TOKENS[:300])
    _close(retried, _run(full, TOKENS[300:400], pos0=300))


def test_a_full_global_cache_returns_1_and_changes_nothing(path):
    ctx = _ctx(_model(path, "iswa"), n_ctx=512)
    _run(ctx, TOKENS[:500])
    before = ctx.memory.cells_snapshot()
    assert ctx.decode(Batch.from_tokens(TOKENS[:20], pos0=500)) == DECODE_NO_KV_SLOT
    assert ctx.memory.cells_snapshot() == before


def test_a_window_cache_too_small_for_every_sequences_window_returns_1_and_changes_nothing(path):
    wide = SlidingWindow(200, frozenset({0}))   # 200 + 16 -> 256 cells: one sequence's window, not two
    model = Model.load(path)
    arch_class = type(model.arch)
    model.arch = type("Wide", (arch_class,), {"create_memory": lambda self, hp, n_ctx, backend, tk, tv, n_ub:
                                                   IswaCache(hp, n_ctx, backend, tk, tv, wide, n_ub)})()
    ctx = _ctx(model)
    _run(ctx, TOKENS[:200], seq_id=0)
    before = ctx.memory.cells_snapshot()
    assert ctx.decode(Batch.from_tokens(TOKENS[:100], seq_id=1)) == DECODE_NO_KV_SLOT
    assert ctx.memory.cells_snapshot() == before
    assert ctx.decode(Batch.from_tokens(TOKENS[:50], seq_id=1)) == DECODE_OK   # 57 cells free or out of seq 0's window


def test_a_context_shift_that_needs_dropped_positions_is_refused_and_swa_full_shifts_as_the_full_cache(path):
    ctx = _ctx(_model(path, "iswa"))
    _run(ctx, TOKENS[:500])
    assert ctx.memory.seq_rm(0, 4, 496)   # keep 0..3 and 496..499
    before = ctx.memory.cells_snapshot()
    with pytest.raises(GGFlowError, match="window-sized cache no longer holds"):
        ctx.memory.seq_add(0, 496, 500, -492)   # the window of 8 would reach 2 and 3, long dropped
    assert ctx.memory.cells_snapshot() == before
    shifted = {}
    for kind, extra in (("full", {}), ("iswa", {"swa_full": True})):
        ctx = _ctx(_model(path, kind, **extra))
        _run(ctx, TOKENS[:500])
        ctx.memory.seq_rm(0, 4, 496)
        ctx.memory.seq_add(0, 496, 500, -492)
        shifted[kind] = _run(ctx, TOKENS[500:540], pos0=8)
    np.testing.assert_array_equal(shifted["iswa"], shifted["full"])


def test_a_shift_within_what_the_window_cache_holds_continues_as_the_full_cache(path):
    shifted = {}
    for kind in ("full", "iswa"):
        ctx = _ctx(_model(path, kind))
        _run(ctx, TOKENS[:500])
        ctx.memory.seq_rm(0, 4, 100)
        ctx.memory.seq_add(0, 100, 500, -96)   # the window of 404 reaches 397: cached
        shifted[kind] = _run(ctx, TOKENS[500:540], pos0=404)
    _close(shifted["iswa"], shifted["full"])


def test_a_saved_sequence_loads_back_and_continues_the_same(path):
    ctx = _ctx(_model(path, "iswa"))
    _run(ctx, TOKENS[:400])
    state = ctx.memory.save_seq(0)
    assert state.nbytes > 0
    straight = _run(ctx, TOKENS[400:450], pos0=400)
    ctx.memory.seq_rm(0, 0, -1)
    _run(ctx, TOKENS[:30], seq_id=0)   # something else in the cache
    ctx.memory.seq_rm(-1, 0, -1)
    ctx.memory.load_seq(0, state)
    np.testing.assert_array_equal(_run(ctx, TOKENS[400:450], pos0=400), straight)
    other = _ctx(_model(path, "iswa"), n_ctx=512).memory
    with pytest.raises(GGFlowError, match="not saved by a KV cache of 512 cells"):
        other.load_seq(0, state)
    assert other.n_used == 0 and other.swa.n_used == 0


def test_an_iswa_cache_needs_a_local_layer(path):
    model = Model.load(path)
    from ggflow.backends_builtin.cpu.backend import CPUBackend
    from ggflow.core.backend import BackendOptions
    with pytest.raises(GGFlowError, match="at least one sliding-window layer"):
        IswaCache(model.hparams, 64, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32",
                  SlidingWindow(8, frozenset()), 16)


def test_an_llm_evaluates_the_whole_prompt_where_the_window_cache_cannot_continue_the_shared_prefix(
        path, monkeypatch):
    from ggflow.api.llm import LLM
    monkeypatch.setattr(type(Model.load(path).arch), "create_memory",
                        lambda self, hp, n_ctx, backend, tk, tv, n_ub: IswaCache(hp, n_ctx, backend, tk, tv, WINDOW, n_ub))

    def llm():
        return LLM(path, n_ctx=N_CTX, n_ubatch=N_UBATCH, backend="cpu", n_threads=1, type_k="F32", type_v="F32")

    cached = llm()
    cached.eval_prompt(TOKENS[:400])
    near, reused = cached.eval_prompt(TOKENS[:395] + [7, 8])   # 395's window is still cached
    assert reused == 395
    _close(near, llm().eval_prompt(TOKENS[:395] + [7, 8])[0])
    cached.eval_prompt(TOKENS[:400])
    far, reused = cached.eval_prompt(TOKENS[:100] + [7, 8])    # 100's window is not: evaluate it all
    assert reused == 0
    np.testing.assert_array_equal(far, llm().eval_prompt(TOKENS[:100] + [7, 8])[0])
