"""Scheduler: placement by weights, splits into per-backend runs, copies between them, liveness memory."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core import ops
from ggflow.core.backend import HostBuffer
from ggflow.core.graph import Graph
from ggflow.core.ops import Op
from ggflow.core.scheduler import Scheduler
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.errors import BackendError
from tests.numpy_backend import NumpyTestBackend

rng = np.random.default_rng(0)


def weight(backend_name: str, data: np.ndarray, name: str) -> Tensor:
    """A PARAM leaf whose memory is a host buffer owned by the named backend."""
    t = Tensor("F32", data.shape[::-1], name=name, flags=TensorFlag.PARAM)
    t.buffer = HostBuffer.allocate(t.nbytes, backend_name)
    t.numpy()[...] = data
    return t


def small_mlp(weights_on: dict[str, str], seed: int = 1):
    """x -> mul_mat -> silu -> scale -> +bias -> rms_norm -> * pre-norm; returns tensors and a numpy oracle."""
    r = np.random.default_rng(seed)
    w_np, b_np, x_np = (r.standard_normal(s).astype(np.float32) for s in ((6, 8), (6,), (4, 8)))
    w = weight(weights_on["w"], w_np, "w")
    b = weight(weights_on["b"], b_np, "b")
    x = ops.new_input("F32", (8, 4), "x")
    h = ops.mul_mat(w, x); h.name = "mm"
    h = ops.silu(h); h.name = "silu"
    h = ops.scale(h, 0.5); h.name = "scale"
    pre = ops.add(h, b); pre.name = "add"
    n = ops.rms_norm(pre, 1e-6); n.name = "norm"
    out = ops.mul(n, pre); out.name = "out"

    def oracle():
        z = x_np @ w_np.T
        z = z / (1 + np.exp(-z)) * 0.5 + b_np
        return z / np.sqrt((z.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * z

    return x, x_np, out, oracle


def run(sched: Scheduler, graph: Graph, x: Tensor, x_np: np.ndarray, out: Tensor) -> np.ndarray:
    sched.alloc(graph)
    sched.set_input(x, x_np)
    sched.compute(graph)
    return sched.get_output(out)


def test_single_backend_matches_numpy():
    full = NumpyTestBackend(name="full")
    x, x_np, out, oracle = small_mlp({"w": "full", "b": "full"})
    graph = Graph([out])
    sched = Scheduler([full])
    np.testing.assert_allclose(run(sched, graph, x, x_np, out), oracle(), rtol=1e-5, atol=1e-6)
    assert [s.backend.name for s in sched.splits] == ["full"]
    assert not sched.splits[0].copies


def test_partial_backend_splits_and_copies_are_what_the_assignment_implies():
    partial = NumpyTestBackend(ops=(Op.ADD, Op.MUL), name="partial")
    full = NumpyTestBackend(name="full")
    x, x_np, out, oracle = small_mlp({"w": "full", "b": "partial"})
    graph = Graph([out])
    sched = Scheduler([partial, full])
    result = run(sched, graph, x, x_np, out)

    # The bias lives on "partial", which supports add; norm is unsupported there; mul follows add.
    assert [(s.backend.name, [n.name for n in s.nodes]) for s in sched.splits] == [
        ("full", ["mm", "silu", "scale"]),
        ("partial", ["add"]),
        ("full", ["norm"]),
        ("partial", ["out"]),
    ]
    assert [[c.src.name for c in s.copies] for s in sched.splits] == [[], ["scale"], ["add"], ["norm"]]
    assert sched.home[x.id].name == "full"
    assert partial.computed == ["add", "out"] and full.computed == ["mm", "silu", "scale", "norm"]

    x, x_np, out, _ = small_mlp({"w": "full", "b": "full"})  # same data, all on one backend
    reference = run(Scheduler([NumpyTestBackend(name="full")]), Graph([out]), x, x_np, out)
    np.testing.assert_array_equal(result, reference)
    np.testing.assert_allclose(result, oracle(), rtol=1e-5, atol=1e-6)


def test_graph_not_allocated_is_an_error():
    full = NumpyTestBackend(name="full")
    x, _, out, _ = small_mlp({"w": "full", "b": "full"})
    with pytest.raises(BackendError, match="alloc"):
        Scheduler([full]).compute(Graph([out]))


def test_weight_in_a_buffer_of_an_unscheduled_backend_is_named():
    x, _, out, _ = small_mlp({"w": "elsewhere", "b": "full"})
    with pytest.raises(BackendError, match="elsewhere"):
        Scheduler([NumpyTestBackend(name="full")]).alloc(Graph([out]))


def test_in_place_write_on_a_backend_that_cannot_do_it_is_refused():
    cache = Tensor("F32", (4, 8), name="cache", flags=TensorFlag.PARAM)
    cache.buffer = HostBuffer.allocate(cache.nbytes, "partial")
    rows = ops.new_input("I32", (2,), "rows")
    src = ops.new_input("F32", (4, 2), "src")
    write = ops.set_rows(cache, src, rows)
    with pytest.raises(BackendError, match="set_rows"):
        Scheduler([NumpyTestBackend(ops=(Op.ADD,), name="partial"), NumpyTestBackend(name="full")]).alloc(
            Graph([write]))


def transformer_like(n_layers: int, d: int = 64, n_tokens: int = 16, ff: int = 128):
    """Residual stream with a norm, two projections and a gated FFN per layer; numpy oracle alongside."""
    x_np = rng.standard_normal((n_tokens, d)).astype(np.float32)
    x = ops.new_input("F32", (d, n_tokens), "x")
    layers, cur, ref = [], x, x_np.astype(np.float64)
    for il in range(n_layers):
        wa, wg, wu, wd = (rng.standard_normal(s).astype(np.float32) * 0.1
                          for s in ((d, d), (ff, d), (ff, d), (d, ff)))
        before = len(layers)
        n = ops.rms_norm(cur, 1e-5)
        attn = ops.mul_mat(weight("full", wa, f"wa{il}"), n)
        cur = ops.add(cur, attn)
        n = ops.rms_norm(cur, 1e-5)
        g = ops.silu(ops.mul_mat(weight("full", wg, f"wg{il}"), n))
        u = ops.mul_mat(weight("full", wu, f"wu{il}"), n)
        cur = ops.add(cur, ops.mul_mat(weight("full", wd, f"wd{il}"), ops.mul(g, u)))
        layers.append(before)

        def rms(v):
            return v / np.sqrt((v ** 2).mean(-1, keepdims=True) + 1e-5)
        ref = ref + rms(ref) @ wa.T
        nn = rms(ref)
        gg = nn @ wg.T
        ref = ref + ((gg / (1 + np.exp(-gg))) * (nn @ wu.T)) @ wd.T
    return x, x_np, cur, ref


def test_compute_memory_is_about_one_layer_not_the_sum_over_layers():
    x, x_np, out, ref = transformer_like(20)
    graph = Graph([out])
    sched = Scheduler([NumpyTestBackend(name="full")])
    result = run(sched, graph, x, x_np, out)
    np.testing.assert_allclose(result, ref, rtol=2e-4, atol=2e-4)  # f32 over 20 residual layers

    per_layer = sum(n.nbytes for n in graph.nodes) / 20
    total = sum(n.nbytes for n in graph.nodes)
    used = sched.compute_buffer_sizes["full"]
    assert used <= 3 * per_layer, (used, per_layer)
    assert used * 6 < total


def test_reallocating_a_graph_of_the_same_shape_reuses_the_compute_buffer():
    sched = Scheduler([NumpyTestBackend(name="full")])
    x, x_np, out, _ = transformer_like(2)
    run(sched, Graph([out]), x, x_np, out)
    buffer = sched._buffers["full"]
    x, x_np, out, _ = transformer_like(2)
    run(sched, Graph([out]), x, x_np, out)
    assert sched._buffers["full"] is buffer and sched.n_allocs == 2


def test_stats_count_splits_copies_and_bytes_per_compute_and_in_total():
    partial = NumpyTestBackend(ops=(Op.ADD, Op.MUL), name="partial")
    x, x_np, out, _ = small_mlp({"w": "full", "b": "partial"})
    graph = Graph([out])
    sched = Scheduler([partial, NumpyTestBackend(name="full")])
    run(sched, graph, x, x_np, out)
    sched.compute(graph)
    stats = sched.stats
    per_compute = 3 * 6 * 4 * 4   # scale, add and norm outputs ([6, 4] F32) cross once each
    assert (stats.n_splits, stats.n_copies, stats.bytes_copied) == (4, 3, per_compute)
    assert stats.nodes == {"partial": 2, "full": 4}
    assert (stats.n_computes, stats.total_copies, stats.total_bytes_copied) == (2, 6, 2 * per_compute)
    assert stats.n_weight_copies == 0   # the bias is read where it lives
    assert stats.as_dict()["bytes_copied"] == per_compute and "4 split(s)" in stats.summary()


def test_a_backend_with_only_f32_mul_mat_gets_every_matmul_and_each_weight_once():
    n_layers = 3
    x, x_np, out, ref = transformer_like(n_layers)
    graph = Graph([out])
    matmul = NumpyTestBackend(ops=(Op.MUL_MAT,), name="matmul")
    full = NumpyTestBackend(name="full")
    sched = Scheduler([matmul, full])
    np.testing.assert_allclose(run(sched, graph, x, x_np, out), ref, rtol=2e-4, atol=2e-4)
    mms = [n for n in graph.nodes if n.op == Op.MUL_MAT]
    assert all(sched.home[n.id] is matmul for n in mms) and matmul.computed == [n.name for n in mms]
    assert sched.stats.nodes["matmul"] == 4 * n_layers
    assert sched.stats.n_weight_copies == 4 * n_layers
    assert sched.stats.weight_bytes_copied == sum(n.src[0].nbytes for n in mms)
    # every matmul is a split of its own (silu and mul run between them): its input crosses to it, its
    # output back
    copies = [c for s in sched.splits for c in s.copies]
    assert sched.stats.n_copies == len(copies) == 2 * 4 * n_layers
    assert sched.stats.bytes_copied == sum(c.dst.nbytes for c in copies)
    sched.compute(graph)
    assert sched.stats.n_weight_copies == 4 * n_layers   # not again


def test_a_strided_view_crosses_with_its_layout():
    a_np, b_np = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    a = ops.new_input("F32", (4, 6), "a")
    act = ops.silu(a); act.name = "silu"
    seen = ops.transpose(act)                      # [6, 4] with strides of a [4, 6] tensor
    out = ops.add(seen, weight("partial", b_np.T.copy(), "b")); out.name = "add"
    partial = NumpyTestBackend(ops=(Op.ADD,), name="partial")
    sched = Scheduler([partial, NumpyTestBackend(name="full")])
    result = run(sched, Graph([out]), a, a_np, out)
    [copy] = [c for s in sched.splits for c in s.copies]
    assert copy.src is seen and copy.dst.nb == seen.nb and not seen.is_contiguous()
    assert sched.home[out.id] is partial and sched.stats.bytes_copied == seen.nbytes
    np.testing.assert_allclose(result, (a_np / (1 + np.exp(-a_np))).T + b_np.T, rtol=1e-6)
