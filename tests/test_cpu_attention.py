"""Attention over the KV cache as one kernel (ops/attention.py), its expf and soft_max pieces.

The fused kernel must give the unfused nodes' kqv bit for bit (K x Q, soft_max and V x P one by one, with
their own page skips), for F16 and F32 caches, grouped query heads, tokens that see different pages, a
token that sees nothing (NaN, as in ggml), more tokens than one task takes, and fewer tokens than tasks (a
decode step's heads split among the tasks).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.backends_builtin.cpu.ops import attention
from ggflow.backends_builtin.cpu import spare_cores, thread_choice
from ggflow.backends_builtin.cpu.products import fixed_order
from ggflow.backends_builtin.cpu.ops.softmax import soft_max_kernel, soft_max_rows
from ggflow.core import ops
from ggflow.core.backend import BackendOptions
from ggflow.core.graph import Graph
from ggflow.core.tensor import Tensor, TensorFlag
from tests.test_cpu_ops import allocate, leaf, randn

rng = np.random.default_rng(31)
PAGE = fixed_order.PAGE


def attention_graph(cache: str, n_kv: int, visible: list[tuple[int, int]], n_head=6, n_kv_head=2, hd=64,
                    k=None, v=None, q=None, heads_last=True):
    """kq -> soft_max -> kqv -> cont(permute(kqv)) as GraphBuilder.attention makes it (heads_last=False:
    kqv itself the result), over a cache of n_kv cells; token t sees cells visible[t] = (first, end)
    (end <= first: none). k, v (n_kv, n_kv_head, hd), q (n, n_head, hd): the contents, random where not
    given. The result's numpy array: (1, n, n_head, hd), or kqv's (1, n_head, n, hd)."""
    n = len(visible)
    dtype = np.float16 if cache == "F16" else np.float32
    k = randn(n_kv, n_kv_head, hd) * 0.5 if k is None else k
    v = randn(n_kv, n_kv_head, hd) if v is None else v
    q = randn(n, n_head, hd, scale=2.0) if q is None else q
    k_cache, v_cache = leaf(cache, k.astype(dtype)), leaf(cache, v.astype(dtype))   # [hd, n_kv_head, n_kv]
    q = leaf("F32", q)                                                              # [hd, n_head, n]
    mask_np = np.full((n + 3, n_kv), -np.inf, np.float32)                           # 3 rows of padding
    for t, (first, end) in enumerate(visible):
        mask_np[t, first:end] = 0.0
    mask = leaf("F32", mask_np, flags=TensorFlag.INPUT)
    keys = ops.permute(k_cache, 0, 2, 1, 3)                                          # [hd, n_kv, n_kv_head]
    kq = ops.mul_mat(keys, ops.permute(q, 0, 2, 1, 3))                               # [n_kv, n, n_head]
    p = ops.soft_max(kq, mask, 0.125)
    values = ops.permute(v_cache, 1, 2, 0, 3)                                        # [n_kv, hd, n_kv_head]
    kqv = ops.mul_mat(values, p)                                                     # [hd, n, n_head]
    return (ops.cont(ops.permute(kqv, 0, 2, 1, 3)) if heads_last else kqv), (kq, p)


def run_plan(out: Tensor, fuse: bool) -> tuple[np.ndarray, int]:
    graph = Graph([out])
    for t in (*graph.leafs, *graph.nodes):
        if t.view_src is None and t.buffer is None:
            allocate(t)
    backend = CPUBackend()
    backend.fuse = fuse
    plan = backend.compile(graph.nodes)
    plan()
    return out.numpy().copy(), len(plan.kernels)


VISIBLE = [(0, 40), (0, 100), (128, 190), (0, 0), (0, 192), (64, 128), (5, 6)]


@pytest.mark.parametrize("cache", ["F16", "F32"])
@pytest.mark.parametrize("heads_last", [True, False], ids=["with the cont", "kqv"])
def test_fused_attention_gives_the_unfused_result_bit_for_bit(cache, heads_last):
    out, _ = attention_graph(cache, 192, VISIBLE, heads_last=heads_last)
    unfused, n_unfused = run_plan(out, fuse=False)
    fused, n_fused = run_plan(out, fuse=True)
    assert (n_unfused, n_fused) == ((4, 1) if heads_last else (3, 1))
    np.testing.assert_array_equal(fused.view(np.uint32), unfused.view(np.uint32))
    tokens = fused[0] if heads_last else fused[0].transpose(1, 0, 2)                 # (token, head, hd)
    assert np.isnan(tokens[3]).all() and not np.isnan(np.delete(tokens, 3, axis=0)).any()


def test_fused_attention_over_more_tokens_than_a_task_in_both_drivers(monkeypatch):
    # the plan keeps its threads even where another process (the suite's kernel prewarm) keeps a core busy
    monkeypatch.setattr(spare_cores, "ENABLED", False)
    n = attention.TOKENS_PER_TASK * 2 + 3
    visible = [(0, 1 + (7 * t) % 256) for t in range(n)]          # causal-like, every page count
    out, _ = attention_graph("F16", 256, visible, n_head=8, n_kv_head=4)
    unfused, _ = run_plan(out, fuse=False)
    graph = Graph([out])
    plan = CPUBackend().compile(graph.nodes)
    assert len(plan.kernels) == 1
    for _ in range(4):      # thread_choice runs a new size parallel twice, then serial twice
        out.numpy()[...] = 0
        plan()
        np.testing.assert_array_equal(out.numpy().view(np.uint32), unfused.view(np.uint32))
    for part in ("scores", "outputs"):
        assert thread_choice.choice_for(("attention", 4, 256, (1, 8, n, 64), part)).seen == [2, 2]


@pytest.mark.parametrize("n_tokens, n_head, parts", [(1, 32, 4), (1, 3, 3), (1, 1, 1), (2, 9, 2), (2, 1, 1),
                                                   (3, 32, 2), (4, 32, 1), (40, 32, 1)])
def test_fewer_tokens_than_tasks_split_their_query_heads(n_tokens, n_head, parts):
    assert attention.head_parts(n_tokens, n_head) == parts


@pytest.mark.parametrize("n_head, n_kv_head", [(8, 4), (9, 3), (8, 2), (6, 1), (3, 3)])
@pytest.mark.parametrize("n_tokens", [1, 2, 3])
def test_a_decode_steps_heads_split_among_tasks_in_both_drivers(monkeypatch, n_head, n_kv_head, n_tokens):
    """Runs of query heads, some of them meeting in a K/V head (9/3: 0-1, 2-3, 4-5, 6-8; 6/1: all in one)."""
    monkeypatch.setattr(spare_cores, "ENABLED", False)
    visible = [(0, 150 + 20 * t) for t in range(n_tokens)]          # three pages, then four
    out, _ = attention_graph("F16", 768, visible, n_head=n_head, n_kv_head=n_kv_head)   # big enough for threads
    unfused, _ = run_plan(out, fuse=False)
    plan = CPUBackend().compile(Graph([out]).nodes)
    assert len(plan.kernels) == 1
    for _ in range(4):      # parallel twice, then serial twice
        out.numpy()[...] = 0
        plan()
        np.testing.assert_array_equal(out.numpy().view(np.uint32), unfused.view(np.uint32))
    for part in ("scores", "outputs"):
        assert thread_choice.choice_for(("attention", n_kv_head, 768, (1, n_head, n_tokens, 64), part)).seen == [2, 2]


@pytest.mark.parametrize("n_threads, n_kv, split", [(1, 704, False), (2, 704, True), (2, 64, False)],
                         ids=["one thread", "two threads", "too small for two"])
@pytest.mark.parametrize("n_tokens", [1, 3])
def test_only_a_layer_that_may_run_parallel_splits_its_tokens_heads(monkeypatch, n_tokens, n_threads, n_kv, split):
    """A layer bound for one thread, or too small for threads, keeps each token's heads in one task and never
    takes the parallel drivers (no thread choice kept for its size); the bits are the same either way."""
    monkeypatch.setattr(spare_cores, "ENABLED", False)
    key = ("attention", 3, n_kv, (1, 9, n_tokens, 64), "scores")
    thread_choice._choices.pop(key, None)         # another case of this test may have run this size
    bound = []
    monkeypatch.setattr(attention.entry_points, "bind",
                        lambda kernel, *args: bound.append((kernel, args)) or (lambda: kernel(*args)))
    visible = [(0, n_kv - 4 - 10 * t) for t in range(n_tokens)]
    out, _ = attention_graph("F16", n_kv, visible, n_head=9, n_kv_head=3)
    unfused, _ = run_plan(out, fuse=False)
    plan = CPUBackend(BackendOptions(n_threads=n_threads)).compile(Graph([out]).nodes)
    assert len(plan.kernels) == 1
    parts = {args[10] for kernel, args in bound if kernel in (attention.scores_serial, attention.outputs_serial)}
    assert parts == {attention.head_parts(n_tokens, 9) if split else 1}
    for _ in range(4):
        out.numpy()[...] = 0
        plan()
        np.testing.assert_array_equal(out.numpy().view(np.uint32), unfused.view(np.uint32))
    assert (key in thread_choice._choices) == split


def test_a_tokens_attention_does_not_depend_on_the_other_tokens():
    k, v, q = randn(192, 2, 64), randn(192, 2, 64), randn(3, 6, 64)
    alone, _ = attention_graph("F16", 192, [(64, 150)], k=k, v=v, q=q[1:2])
    batched, _ = attention_graph("F16", 192, [(0, 64), (64, 150), (150, 192)], k=k, v=v, q=q)
    one, _ = run_plan(alone, fuse=True)
    three, _ = run_plan(batched, fuse=True)
    np.testing.assert_array_equal(three[0, 1].view(np.uint32), one[0, 0].view(np.uint32))


def test_fused_attention_whose_result_takes_the_scores_memory_packs_elsewhere():
    """The allocator may give the cont kq's memory (kq is dead by then); the kernel then packs its rows in a
    scratch of its own, not in kq's memory it writes the result into."""
    out, (kq, _) = attention_graph("F16", 192, VISIBLE)
    graph = Graph([out])
    for t in (*graph.leafs, *graph.nodes):
        if t.view_src is None and t.buffer is None:
            allocate(t)
    out.buffer, out.offset = kq.buffer, kq.offset
    results = []
    for fuse in (False, True):
        backend = CPUBackend()
        backend.fuse = fuse
        plan = backend.compile(graph.nodes)
        plan()
        results.append((out.numpy().copy(), len(plan.kernels)))
    (unfused, n_unfused), (fused, n_fused) = results
    assert (n_unfused, n_fused) == (4, 1)
    np.testing.assert_array_equal(fused.view(np.uint32), unfused.view(np.uint32))


def test_attention_whose_scores_are_read_elsewhere_runs_unfused():
    out, (kq, _) = attention_graph("F16", 128, [(0, 70), (0, 128)])
    kq.flags |= TensorFlag.OUTPUT
    _, n_kernels = run_plan(out, fuse=True)
    assert n_kernels == 4


# -- soft_max ------------------------------------------------------------------------------------
def test_soft_max_kernel_is_numpys_expression_but_for_the_sums_order():
    x = randn(2, 3, 5, 300, scale=6.0)
    mask = np.where(rng.random((1, 1, 5, 300)) < 0.3, -np.inf, 0.0).astype(np.float32)
    expected, y = np.empty_like(x), np.empty_like(x)
    soft_max_rows(x, mask, np.float32(0.3), expected)
    soft_max_kernel(x, mask, True, np.float32(0.3), y)
    np.testing.assert_allclose(y, expected, rtol=1.5e-7, atol=0)     # 1/sum may round the other way
    assert (y[..., mask[0, 0] == -np.inf] == 0).all()


def test_soft_max_bits_do_not_depend_on_where_masked_pages_lie():
    """What lets the fused kernel skip pages: a row's probabilities are the same bits wherever whole pages of
    masked cells sit between its cells (each cell's sum lane is its index mod 8, zeros add nothing)."""
    cells = randn(1, 1, 1, 2 * PAGE, scale=4.0)
    compact, spread = np.empty_like(cells), np.full((1, 1, 1, 5 * PAGE), -np.inf, np.float32)
    spread[..., PAGE:2 * PAGE], spread[..., 3 * PAGE:4 * PAGE] = cells[..., :PAGE], cells[..., PAGE:]
    y_spread = np.empty_like(spread)
    soft_max_kernel(cells, np.zeros((1, 1, 1, 1), np.float32), False, np.float32(1), compact)
    soft_max_kernel(spread, np.zeros((1, 1, 1, 1), np.float32), False, np.float32(1), y_spread)
    seen = np.concatenate([y_spread[..., PAGE:2 * PAGE], y_spread[..., 3 * PAGE:4 * PAGE]], axis=-1)
    np.testing.assert_array_equal(seen.view(np.uint32), compact.view(np.uint32))


def test_a_plans_layers_share_one_copy_of_a_query_in_another_layout(tiny_model_path):
    """Each layer's query is a permuted view, copied for the kernel at every run: into one buffer for all
    the layers of a plan, not one per layer (a prompt's queries in every layer: megabytes)."""
    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    ctx = Context(Model.load(tiny_model_path("llama")), n_ctx=64, backends="cpu", n_threads=1)
    assert ctx.decode(Batch.from_tokens(list(range(1, 17)))) == 0
    runs = [k for k in ctx.scheduler.splits[0].plan.kernels
            if getattr(k, "__qualname__", "").startswith("bind_attention")]
    assert len(runs) == ctx.model.hparams.n_layer > 1
    copies = {id(dict(zip(r.__code__.co_freevars, r.__closure__))["q_rows"].cell_contents) for r in runs}
    views = {id(dict(zip(r.__code__.co_freevars, r.__closure__))["q_view"].cell_contents) for r in runs}
    assert len(copies) == 1 and len(views) == len(runs)   # one buffer, each layer's own query view
