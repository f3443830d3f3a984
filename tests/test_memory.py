"""The memory's contract: a batch is a transaction, the K-shift runs on the Context's scheduler, and an
architecture's create_memory decides what memory a Context keeps."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK
from ggflow.core.kv_cache import KVCache
from ggflow.core.memory import Memory
from ggflow.core.model import Model
from ggflow.errors import BackendError, GGFlowError, PluginError
from tests.test_context import TOKENS, ctx_for, llama  # noqa: F401  (llama: the module's model fixture)


def test_an_exception_mid_batch_rolls_back_every_ubatch_the_batch_applied(llama, monkeypatch):
    ctx = ctx_for(llama, n_ubatch=4)
    assert ctx.decode(Batch.from_tokens(TOKENS[:3])) == DECODE_OK
    before = ctx.memory.cells_snapshot(), ctx.memory.seq_pos_max(0), ctx.memory.n_used
    compute, seen = ctx.scheduler.compute, []

    def fail_on_second_ubatch(graph):
        seen.append(ctx.memory.seq_pos_max(0))
        if len(seen) == 2:
            raise BackendError("device lost")
        compute(graph)

    monkeypatch.setattr(ctx.scheduler, "compute", fail_on_second_ubatch)
    with pytest.raises(BackendError, match="device lost"):
        ctx.decode(Batch.from_tokens(TOKENS[3:12], pos0=3))
    assert seen == [6, 10]   # the first ubatch had landed when the second one failed
    assert (ctx.memory.cells_snapshot(), ctx.memory.seq_pos_max(0), ctx.memory.n_used) == before

    monkeypatch.undo()
    assert ctx.decode(Batch.from_tokens(TOKENS[3:12], pos0=3, all_logits=True)) == DECODE_OK
    fresh = ctx_for(llama, n_ubatch=4)
    fresh.decode(Batch.from_tokens(TOKENS[:3]))
    fresh.decode(Batch.from_tokens(TOKENS[3:12], pos0=3, all_logits=True))
    np.testing.assert_array_equal(ctx.get_logits(), fresh.get_logits())


@pytest.fixture
def cache(llama):
    from ggflow.backends_builtin.cpu.backend import CPUBackend
    from ggflow.core.backend import BackendOptions
    return KVCache(llama.hparams, 16, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32")


def test_a_memory_batch_left_without_commit_restores_the_cells(cache):
    with cache.begin(Batch.from_tokens(TOKENS[:6]).split(4)) as placed:
        assert [slot.cells.tolist() for _, slot in placed] == [[0, 1, 2, 3], [4, 5]]
        assert cache.seq_pos_max(0) == 5 and cache.n_used == 6
    assert cache.seq_pos_max(0) == -1 and cache.n_used == 0 and cache.n_free == 16


def test_a_committed_memory_batch_keeps_its_cells_and_cannot_be_reused(cache):
    with cache.begin(Batch.from_tokens(TOKENS[:6]).split(4)) as placed:
        for _ in placed:
            pass
        placed.commit()
    assert cache.seq_pos_min(0) == 0 and cache.seq_pos_max(0) == 5 and cache.n_used == 6
    with pytest.raises(GGFlowError, match="already committed"):
        placed.commit()


def test_a_memory_batch_commits_only_whole(cache):
    placed = cache.begin(Batch.from_tokens(TOKENS[:6]).split(4))
    next(iter(placed))
    with pytest.raises(GGFlowError, match="commit after 1 of 2 ubatches"):
        placed.commit()
    placed.rollback()
    assert cache.n_used == 0


def test_begin_without_room_is_none_and_changes_nothing(cache):
    before = cache.cells_snapshot()
    assert cache.begin(Batch.from_tokens(TOKENS * 2).split(4)) is None
    assert cache.cells_snapshot() == before


def test_the_k_shift_runs_on_the_contexts_scheduler(llama, monkeypatch):
    ctx = ctx_for(llama)
    ctx.decode(Batch(np.array(TOKENS[:6]), np.arange(10, 16), 0, False))
    ctx.memory.seq_add(0, 10, -1, -10)
    compute, ran = ctx.scheduler.compute, []
    monkeypatch.setattr(ctx.scheduler, "compute", lambda g: (ran.append({t.name for t in g.leafs}), compute(g)))
    assert ctx.decode(Batch.from_tokens(TOKENS[6:8], pos0=6)) == DECODE_OK
    assert len(ran) == 2 and "inp_k_shift" in ran[0] and "inp_k_shift" not in ran[1]


class RecordingCache(KVCache):
    """The unified cache, recording which of its verbs the Context and the graph builder called."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls: list[str] = []

    def begin(self, ubatches):
        self.calls.append("begin")
        return super().begin(ubatches)

    def cpy_k(self, il, k_cur, idxs):
        self.calls.append(f"cpy_k{il}")
        return super().cpy_k(il, k_cur, idxs)

    def get_v(self, il, n_kv):
        self.calls.append(f"get_v{il}")
        return super().get_v(il, n_kv)


def with_memory(model: Model, create_memory) -> Model:
    """The model with its architecture subclassed to make its memory with create_memory."""
    arch_class = type(model.arch)
    model.arch = type(f"Custom{arch_class.__name__}", (arch_class,), {"create_memory": create_memory})()
    return model


def test_the_context_keeps_the_memory_its_architecture_creates(tiny_model_path):
    made = []

    def create_memory(self, hp, n_ctx, backend, type_k, type_v, n_ubatch):
        made.append((n_ctx, type_k, type_v, n_ubatch))
        return RecordingCache(hp, n_ctx, backend, type_k, type_v)

    model = with_memory(Model.load(tiny_model_path("llama")), create_memory)
    ctx = ctx_for(model, n_ctx=32)
    assert made == [(32, "F32", "F32", 32)] and isinstance(ctx.memory, RecordingCache)
    assert ctx.decode(Batch.from_tokens(TOKENS[:4])) == DECODE_OK
    n_layer = model.hparams.n_layer
    assert ctx.memory.calls[0] == "begin"
    assert [c for c in ctx.memory.calls if c.startswith("cpy_k")] == [f"cpy_k{il}" for il in range(n_layer)]
    assert [c for c in ctx.memory.calls if c.startswith("get_v")] == [f"get_v{il}" for il in range(n_layer)]
    assert ctx.memory.seq_pos_max(0) == 3


def test_create_memory_must_return_a_memory(tiny_model_path):
    model = with_memory(Model.load(tiny_model_path("llama")), lambda self, *args: {"cells": 32})
    with pytest.raises(PluginError, match="create_memory returned a dict, not a ggflow.core.memory.Memory"):
        ctx_for(model)


def test_the_default_memory_is_the_unified_cache(llama):
    memory = ctx_for(llama, n_ctx=32).memory
    assert isinstance(memory, KVCache) and isinstance(memory, Memory)
    assert (memory.size, memory.n_used, memory.n_free) == (32, 0, 32)


def test_a_sequence_grows_past_its_last_cell_so_its_cells_stay_in_position_order(cache):
    """Attention sums cells in cell order: a hole below a sequence's cells must not take its next tokens."""
    two = Batch(np.array(TOKENS[:6]), np.array([0, 1, 2, 0, 1, 2]), np.array([0, 0, 0, 1, 1, 1]), np.zeros(6, bool))
    with cache.begin(two.split(8)) as placed:
        list(placed)
        placed.commit()
    cache.seq_rm(0)                                 # cells 0-2 are free now; sequence 1 holds 3-5
    nxt = Batch.from_tokens(TOKENS[6:8], pos0=3, seq_id=1)
    with cache.begin(nxt.split(8)) as placed:
        [(_, slot)] = list(placed)
        placed.commit()
    assert slot.cells.tolist() == [6, 7]
    fresh = Batch.from_tokens(TOKENS[:2])            # a sequence with no cells takes the lowest free ones
    with cache.begin(fresh.split(8)) as placed:
        [(_, slot)] = list(placed)
        placed.commit()
    assert slot.cells.tolist() == [0, 1]


def _place(cache, batch):
    with cache.begin(batch.split(512)) as placed:
        [(_, slot)] = list(placed)
        placed.commit()
    return slot.cells.tolist()


def test_sequences_decoding_side_by_side_keep_their_cells_in_pages_of_their_own(llama):
    """Each sequence's cells in CELL_PAGE pages of its own, in position order, where there is room (the CPU's
    attention skips the pages a token does not see, products.fixed_order)."""
    from ggflow.backends_builtin.cpu.backend import CPUBackend
    from ggflow.core.backend import BackendOptions
    from ggflow.core.memory import CELL_PAGE
    cache = KVCache(llama.hparams, 6 * CELL_PAGE, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32")
    for s in range(3):
        assert _place(cache, Batch.from_tokens(TOKENS[:10], seq_id=s))[0] == s * CELL_PAGE
    for pos in range(10, 80):                    # one token per sequence per step, as a serving step
        _place(cache, Batch(np.array(TOKENS[:3]), np.full(3, pos), np.arange(3), np.zeros(3, bool)))
    cells = cache.cells_snapshot()
    for s in range(3):
        held = np.flatnonzero(cells.seq[:, s])
        assert (np.diff(cells.pos[held]) == 1).all()           # in position order, cell after cell
        assert len(held) == 80
    pages = cells.seq[:, :3].reshape(6, CELL_PAGE, 3).any(axis=1)     # (page, sequence): two pages each
    assert (pages.sum(axis=1) == 1).all()                       # every page one sequence's


def test_without_a_whole_free_page_a_sequence_takes_the_free_cells_after_its_own(llama):
    from ggflow.backends_builtin.cpu.backend import CPUBackend
    from ggflow.core.backend import BackendOptions
    from ggflow.core.memory import CELL_PAGE
    cache = KVCache(llama.hparams, 2 * CELL_PAGE, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32")
    first = _place(cache, Batch.from_tokens(list(range(1, CELL_PAGE + 7)), seq_id=0))
    assert first == list(range(CELL_PAGE + 6))
    assert _place(cache, Batch.from_tokens(TOKENS[:4], seq_id=1)) == list(range(CELL_PAGE + 6, CELL_PAGE + 10))
    # and sequence 0 continues after its last cell, past sequence 1's
    assert _place(cache, Batch.from_tokens(TOKENS[:2], pos0=CELL_PAGE + 6, seq_id=0)) == [CELL_PAGE + 10, CELL_PAGE + 11]


def test_a_cache_of_part_of_a_page_holds_its_size_in_a_whole_page_that_the_mask_hides_past_it(cache):
    from ggflow.core.memory import CELL_PAGE
    assert cache.size == 16 and [t.ne[1] for t in (cache.k[0], cache.v[0])] == [CELL_PAGE, CELL_PAGE]
    batch = Batch.from_tokens(TOKENS + TOKENS[:4])
    with cache.begin(batch.split(512)) as placed:
        [(ub, slot)] = list(placed)
        assert slot.n_kv == CELL_PAGE                   # the attended range ends on a page
        mask = cache.mask(slot, ub)
        placed.commit()
    assert mask.shape == (16, CELL_PAGE) and np.isneginf(mask[:, 16:]).all()
    assert (mask[:, :16] == np.where(np.tri(16, dtype=bool), 0, -np.inf)).all()     # causal over its cells
    assert cache.n_free == 0 and cache.begin(Batch.from_tokens(TOKENS[:1], pos0=16).split(1)) is None


def test_a_context_of_part_of_a_page_attends_with_the_fused_kernel(llama, monkeypatch):
    from ggflow.backends_builtin.cpu.ops import attention as kernels_attention
    bound = []
    bind = kernels_attention.bind_attention
    monkeypatch.setattr(kernels_attention, "bind_attention", lambda *a, **kw: bound.append(bind(*a, **kw)) or bound[-1])
    logits = {}
    for n_ctx in (100, 128):
        bound.clear()
        ctx = ctx_for(llama, n_ctx=n_ctx)
        assert ctx.decode(Batch.from_tokens(TOKENS * 8)) == DECODE_OK
        assert ctx.decode(Batch.from_tokens(TOKENS[:1], pos0=96)) == DECODE_OK
        assert bound and all(kernel is not None for kernel in bound)
        logits[n_ctx] = ctx.get_logits().copy()
    np.testing.assert_array_equal(logits[100].view(np.uint32), logits[128].view(np.uint32))


def test_the_next_cells_of_a_sequences_page_are_what_the_full_search_finds():
    """_room takes the cells right after a sequence's last one directly where they are free and on its page (a
    decode step); on random caches that is always the cell list the full search (_search_room) returns."""
    from ggflow.core.kv_cache import _room, _search_room
    from ggflow.core.memory import CELL_PAGE
    rng = np.random.default_rng(5)
    direct = 0
    for _ in range(400):
        free = rng.random(4 * CELL_PAGE) < rng.choice([0.3, 0.9, 1.0])
        after, n = int(rng.integers(0, 4 * CELL_PAGE)), int(rng.integers(1, 5))
        if np.count_nonzero(free) < n:
            continue
        end = after + n
        direct += bool(after % CELL_PAGE and end <= len(free) and end <= after - after % CELL_PAGE + CELL_PAGE
                       and free[after:end].all())
        np.testing.assert_array_equal(_room(free, after, n), _search_room(free, after, n))
    assert direct > 50     # the direct case was exercised, not only the search
