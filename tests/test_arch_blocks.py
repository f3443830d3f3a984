"""The seams and blocks an architecture composes beyond llama's, each against a numpy expression of its math:
plugin ops with a CPU reference, tanh and softcapping, GEGLU, the embedding scale, a per-layer RoPE base and
attention factor, sliding-window attention over the KV cache (per-layer masks), and a window through a Context.

Tolerances as in test_cpu_ops: float32 results against float64 references at rtol ~1e-5; rope at atol 1e-4.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.core import ops
from ggflow.core.backend import BackendOptions
from ggflow.core.batch import Batch
from ggflow.core.graph import Graph
from ggflow.core.graph_builder import FFN, GraphBuilder
from ggflow.core.kv_cache import KVCache
from ggflow.core.memory import SlidingWindow
from ggflow.core.model import HParams
from ggflow.core.scheduler import Scheduler
from ggflow.errors import GGFlowError, PluginError, ShapeError, UnknownNameError
from tests.numpy_backend import NumpyTestBackend
from tests.test_context import TOKENS, ctx_for, llama, logits_of  # noqa: F401  (llama: a module fixture)
from tests.test_cpu_ops import _gelu64, _rope64, allocate, leaf, randn, run, values


# -- plugin ops ----------------------------------------------------------------------------------
def _rowsum_shape(src, params):
    (a,) = src
    if a.type.name not in ("F32", "F16"):
        raise ShapeError(f"test_rowsum: needs a float tensor, not {a.type.name}")
    return "F32", (1, *a.ne[1:])


def _rowsum_reference(arrays, params):
    (a,) = arrays
    return a.sum(axis=-1, keepdims=True) * params[0]


@pytest.fixture
def rowsum():
    spec = ops.register_op("test_rowsum", _rowsum_shape, _rowsum_reference)
    yield spec
    ops._plugin_ops.pop("test_rowsum")


def test_a_plugin_op_runs_its_numpy_reference_on_the_cpu(rowsum):
    x_np = randn(3, 5, 7)
    out = ops.custom("test_rowsum", leaf("F32", x_np), params=(2.0,))
    assert out.op == "test_rowsum" and list(out.ne[:3]) == [1, 5, 3]
    run(out)
    np.testing.assert_allclose(values(out), x_np.astype(np.float64).sum(-1, keepdims=True) * 2, rtol=1e-5)


def test_a_plugin_op_reads_f16_sources_as_float32(rowsum):
    x_np = randn(4, 6).astype(np.float16)
    out = ops.custom("test_rowsum", leaf("F16", x_np), params=(1.0,))
    run(out)
    np.testing.assert_allclose(values(out), x_np.astype(np.float64).sum(-1, keepdims=True), rtol=1e-5)


def test_the_scheduler_places_a_plugin_op_no_other_backend_has_on_the_cpu(rowsum):
    x_np = randn(2, 8)
    x = ops.new_input("F32", (8, 2), "x")
    out = ops.custom("test_rowsum", ops.add(x, x), params=(1.0,))
    graph = Graph([out])
    sched = Scheduler([NumpyTestBackend(name="fast"), CPUBackend(BackendOptions(n_threads=1))])
    sched.alloc(graph)
    sched.set_input(x, x_np)
    sched.compute(graph)
    assert [s.backend.name for s in sched.splits] == ["fast", "cpu"]
    np.testing.assert_allclose(sched.get_output(out).reshape(2, 1), 2 * x_np.sum(-1, keepdims=True), rtol=1e-5)


def test_a_plugin_op_shape_function_rejects_bad_sources(rowsum):
    with pytest.raises(ShapeError, match="test_rowsum"):
        ops.custom("test_rowsum", leaf("I32", np.arange(4, dtype=np.int32)))


def test_an_unregistered_plugin_op_is_an_unknown_name():
    with pytest.raises(UnknownNameError, match="no_such_op"):
        ops.custom("no_such_op", leaf("F32", randn(4)))


def test_a_plugin_op_cannot_take_a_built_in_name_or_a_taken_one(rowsum):
    with pytest.raises(PluginError, match="built-in"):
        ops.register_op("add", _rowsum_shape, _rowsum_reference)
    assert ops.register_op("test_rowsum", _rowsum_shape, _rowsum_reference) == rowsum   # same: no-op
    with pytest.raises(PluginError, match="already registered"):
        ops.register_op("test_rowsum", _rowsum_shape, lambda arrays, params: arrays[0])


def test_a_reference_returning_the_wrong_shape_is_a_backend_error():
    ops.register_op("test_bad", lambda src, params: ("F32", src[0].ne), lambda arrays, params: np.zeros(3))
    try:
        out = ops.custom("test_bad", leaf("F32", randn(4)))
        with pytest.raises(GGFlowError, match="test_bad"):
            run(out)
    finally:
        ops._plugin_ops.pop("test_bad")


# -- tanh and softcapping ------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", ["F32", "F16"])
def test_tanh(type_name):
    x_np = randn(3, 40, scale=3.0)
    out = ops.tanh(leaf(type_name, x_np.astype(np.float16 if type_name == "F16" else np.float32)))
    run(out)
    x64 = x_np.astype(np.float16 if type_name == "F16" else np.float32).astype(np.float64)
    np.testing.assert_allclose(values(out), np.tanh(x64), rtol=2.0 ** -10 if type_name == "F16" else 1e-6,
                               atol=1e-7)


def _compute(graph: Graph, inputs: dict) -> None:
    """Give every non-view tensor of the graph memory, fill the inputs, compute on the CPU backend."""
    for t in (*graph.leafs, *graph.nodes):
        if t.view_src is None and t.buffer is None:
            allocate(t)
    for t, data in inputs.items():
        t.numpy()[...] = np.asarray(data).reshape(t.numpy().shape)
    CPUBackend(BackendOptions(n_threads=1)).compute(graph.nodes)


def _builder(hp: HParams, memory=None, n_tokens: int = 1, n_kv: int = 1) -> GraphBuilder:
    memory = memory or KVCache(hp, 8, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32")
    return GraphBuilder(SimpleNamespace(hparams=hp, w=None), memory, n_tokens, n_tokens, n_kv)


def _hparams(**kw) -> HParams:
    base = dict(n_vocab=32, n_ctx_train=64, n_embd=16, n_layer=2, n_head=2, n_head_kv=1, n_ff=24,
                n_embd_head_k=8, n_embd_head_v=8, n_rot=8, rope_type=ops.ROPE_NEOX)
    return HParams(**{**base, **kw})


def test_softcap_squashes_into_the_cap():
    x_np = randn(4, 50, scale=40.0)
    out = _builder(_hparams()).softcap(leaf("F32", x_np), 30.0)
    run(out)
    np.testing.assert_allclose(values(out), 30.0 * np.tanh(x_np.astype(np.float64) / 30.0), rtol=1e-5, atol=1e-5)
    assert np.abs(values(out)).max() < 30.0


# -- embedding scale, GEGLU, RoPE per layer ------------------------------------------------------
def test_token_embeddings_are_scaled_when_asked():
    hp = _hparams()
    b = _builder(hp, n_tokens=3)
    table = randn(10, hp.n_embd)
    out = b.token_embeddings(leaf("F32", table), scale=math.sqrt(hp.n_embd))
    ids = np.array([7, 0, 7], dtype=np.int32)
    _compute(Graph([out]), {b.inp_tokens: ids})
    np.testing.assert_allclose(values(out), table[ids].astype(np.float64) * math.sqrt(16), rtol=1e-6)


def test_geglu_ffn_is_down_of_gelu_gate_times_up():
    hp = _hparams()
    x_np, gate, up, down = randn(3, 16), randn(24, 16, scale=0.3), randn(24, 16, scale=0.3), randn(16, 24, scale=0.3)
    out = _builder(hp).ffn(leaf("F32", x_np), up=leaf("F32", up), gate=leaf("F32", gate), down=leaf("F32", down),
                           kind=FFN.GELU_GATED)
    run(out)
    x64 = x_np.astype(np.float64)
    # ggml's gelu looks x up in an F16 table: as test_cpu_ops' reference, gelu of x rounded to F16
    g = x64 @ gate.T.astype(np.float64)
    h = _gelu64(g.astype(np.float16).astype(np.float64)) * (x64 @ up.T.astype(np.float64))
    np.testing.assert_allclose(values(out), h @ down.T.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_rope_block_takes_a_per_layer_base_scale_and_attention_factor():
    hp = _hparams(rope_freq_base=1e6)
    b = _builder(hp, n_tokens=5)
    x_np, pos = randn(5, 2, 8), np.array([0, 3, 9, 100, 511], dtype=np.int32)
    local = b.rope(leaf("F32", x_np), freq_base=10000.0, freq_scale=0.5, attn_factor=0.8)
    glob = b.rope(leaf("F32", x_np))
    _compute(Graph([local, glob]), {b.inp_pos: pos})
    x64 = x_np.astype(np.float64)
    np.testing.assert_allclose(values(local), _rope64(x64, pos, 8, True, 10000.0, 0.5, attn_factor=0.8),
                               rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(values(glob), _rope64(x64, pos, 8, True, 1e6, 1.0), rtol=1e-5, atol=1e-4)


# -- sliding-window attention --------------------------------------------------------------------
def test_sliding_window_pattern_is_llama_cpps():
    swa = SlidingWindow.every(512, 18, 6)
    assert sorted(set(range(18)) - swa.layers) == [5, 11, 17]
    assert SlidingWindow.every(4, 3, 0).layers == {0, 1, 2}   # pattern 0: every layer local
    with pytest.raises(GGFlowError, match="n_swa"):
        SlidingWindow(0, frozenset())


def test_the_windowed_mask_hides_cells_window_or_more_positions_back():
    hp = _hparams()
    cache = KVCache(hp, 16, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32", swa=SlidingWindow(3, frozenset({0})))
    batch = cache.begin(Batch.from_tokens(list(range(7))).split(7))
    ((ub, slot),) = list(batch)
    full, windowed = cache.mask(slot, ub), cache.mask(slot, ub, window=3)
    p, c = np.arange(7)[:, None], np.arange(16)[None, :]
    np.testing.assert_array_equal(np.isfinite(full[:, :16]), c <= p)
    np.testing.assert_array_equal(np.isfinite(windowed[:, :16]), (c <= p) & (p - c < 3))
    inputs = cache.build_inputs(7, slot.n_kv)
    assert cache.kq_mask(0, inputs) is inputs.kq_mask_swa and cache.kq_mask(1, inputs) is inputs.kq_mask
    np.testing.assert_array_equal(cache.input_data(inputs, ub, slot)[inputs.kq_mask_swa], windowed)


def test_a_cache_without_a_window_has_one_mask_for_every_layer():
    cache = KVCache(_hparams(), 8, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32")
    inputs = cache.build_inputs(2, 8)
    assert inputs.kq_mask_swa is None and cache.kq_mask(0, inputs) is inputs.kq_mask


def _attention64(q, k, v, visible, scale, softcap=None):
    """q (T, H, D), k and v (T, 1, D) (one KV head shared by the H query heads), visible (T, T) -> (T, H*D)."""
    kq = np.einsum("thd,sd->hts", q, k[:, 0])
    if softcap:
        kq = softcap * np.tanh(kq / softcap)
    kq = np.where(visible[None], kq * scale, -np.inf)
    w = np.exp(kq - kq.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("hts,sd->thd", w, v[:, 0]).reshape(q.shape[0], -1)


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_attention_on_a_local_layer_sees_only_the_window(softcap):
    hp, n, window = _hparams(), 6, 3
    cache = KVCache(hp, 16, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32",
                    swa=SlidingWindow(window, frozenset({0})))
    batch = cache.begin(Batch.from_tokens(list(range(n))).split(n))
    ((ub, slot),) = list(batch)
    b = _builder(hp, cache, n_tokens=n, n_kv=slot.n_kv)
    q_np, k_np, v_np = randn(n, 2, 8), randn(n, 1, 8), randn(n, 1, 8)
    outs = [b.attention(il, leaf("F32", q_np), leaf("F32", k_np), leaf("F32", v_np), softcap=softcap)
            for il in (0, 1)]
    for out in outs:
        b.graph.expand(out)
    _compute(b.graph, cache.input_data(b.inp_memory, ub, slot))
    p = np.arange(n)
    causal = p[None, :] <= p[:, None]
    q64, k64, v64 = (a.astype(np.float64) for a in (q_np, k_np, v_np))
    scale = 1 / math.sqrt(8)
    local = _attention64(q64, k64, v64, causal & (p[:, None] - p[None, :] < window), scale, softcap)
    glob = _attention64(q64, k64, v64, causal, scale, softcap)
    np.testing.assert_allclose(values(outs[0]), local, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values(outs[1]), glob, rtol=1e-4, atol=1e-5)
    assert not np.allclose(local[window:], glob[window:])   # the window changed what late tokens see


def test_the_k_shift_rerotates_each_layer_with_its_own_rope():
    hp = _hparams(n_head_kv=1)
    backend = CPUBackend(BackendOptions(n_threads=1))
    cache = KVCache(hp, 8, backend, "F32", "F32", layer_rope=[(10000.0, 1.0), (1e6, 0.5)])
    with cache.begin(Batch.from_tokens(list(range(5))).split(5)) as placed:
        for _ in placed:
            pass
        placed.commit()
    keys = [randn(cache.cells, 8) for _ in range(2)]       # (cells, n_embd_k_gqa): one head of 8
    for il in range(2):
        backend.set_tensor(cache.k[il], keys[il])
    cache.seq_add(0, 0, -1, 3)
    assert cache.update(Scheduler([backend]))
    shift = np.array([3] * 5 + [0] * 3, dtype=np.int32)
    for il, (base, scale) in enumerate([(10000.0, 1.0), (1e6, 0.5)]):
        expected = _rope64(keys[il][:8].astype(np.float64)[:, None, :], shift, 8, True, base, scale)[:, 0]
        np.testing.assert_allclose(values(cache.k[il])[:8], expected, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(values(cache.k[il])[8:], keys[il][8:])   # the page's cells past the size


def test_layer_rope_needs_one_entry_per_layer():
    with pytest.raises(GGFlowError, match="layer_rope"):
        KVCache(_hparams(), 8, CPUBackend(BackendOptions(n_threads=1)), "F32", "F32", layer_rope=[(1e4, 1.0)])


# -- a sliding window through a Context ----------------------------------------------------------
def _windowed(model, monkeypatch, n_swa: int) -> None:
    """Make every layer of the model's architecture a sliding-window layer of n_swa positions."""
    window = SlidingWindow(n_swa, frozenset(range(model.hparams.n_layer)))
    monkeypatch.setattr(model.arch, "create_memory", lambda hp, n_ctx, backend, type_k, type_v, n_ubatch: KVCache(
        hp, n_ctx, backend, type_k, type_v, swa=window))


def test_a_window_of_one_makes_every_token_see_only_itself(llama, monkeypatch):
    _windowed(llama, monkeypatch, 1)
    together = logits_of(llama, TOKENS[:6])
    for pos, tok in enumerate(TOKENS[:6]):
        ctx = ctx_for(llama)
        assert ctx.decode(Batch.from_tokens([tok], pos0=pos)) == 0
        np.testing.assert_allclose(together[pos], ctx.get_logits()[0], rtol=1e-5, atol=1e-5)


def test_a_window_as_long_as_the_context_changes_nothing(llama, monkeypatch):
    plain = logits_of(llama, TOKENS)
    _windowed(llama, monkeypatch, len(TOKENS))
    np.testing.assert_array_equal(logits_of(llama, TOKENS), plain)
    _windowed(llama, monkeypatch, 4)
    assert not np.allclose(logits_of(llama, TOKENS)[4:], plain[4:], atol=1e-4)
