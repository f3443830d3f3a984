"""The CPU plan's fused chains and bound kernels give the unfused, unbound results bit for bit.

Each test runs one graph twice on the same inputs, once with ``CPUBackend.fuse`` off (one kernel per node)
and once on, and compares the bytes of every node's result; it also checks that the chain did fuse (fewer
kernels in the plan), else the comparison would prove nothing.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
from ggflow.backends_builtin.cpu.c_arith import f32_bits_to_f16_bits
from ggflow.backends_builtin.cpu.ops.rows import copy_rows_from_f32
from ggflow.core import ops
from ggflow.core.backend import HostBuffer
from ggflow.core.graph import Graph
from ggflow.core.ops import PURE_VIEWS
from ggflow.core.quants import quantize
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.errors import BackendError
from tests.test_cpu_ops import allocate, leaf, randn

rng = np.random.default_rng(77)


def computed_bytes(graph: Graph) -> list[bytes]:
    return [n.numpy().tobytes() for n in graph.nodes if n.view_src is None or n.op == "set_rows"]


def run_both_ways(*outputs: Tensor, reset=lambda: None) -> tuple[list[bytes], list[bytes], int, int]:
    """(unfused results, fused results, unfused kernel count, fused kernel count) of one graph."""
    graph = Graph(outputs)
    for t in (*graph.leafs, *graph.nodes):
        if t.view_src is None and t.buffer is None:
            allocate(t)
    results, counts = [], []
    for fuse in (False, True):
        backend = CPUBackend()
        backend.fuse = fuse
        reset()
        plan = backend.compile(graph.nodes)
        plan()
        results.append(computed_bytes(graph))
        counts.append(len(plan.kernels))
    return results[0], results[1], counts[0], counts[1]


def test_residual_add_rms_norm_and_weight_fuse_to_the_unfused_bits():
    a, b = leaf("F32", randn(3, 64, scale=4.0)), leaf("F32", randn(3, 64))
    w = leaf("F32", randn(64), flags=TensorFlag.PARAM)
    out = ops.mul(ops.rms_norm(ops.add(a, b), 1e-6), w)
    unfused, fused, n_unfused, n_fused = run_both_ways(out)
    assert (n_unfused, n_fused) == (3, 1)
    assert fused == unfused


def test_rms_norm_of_heads_times_a_head_weight_fuses_to_the_unfused_bits():
    x = leaf("F32", randn(5, 4, 32, scale=3.0))      # qk-norm: [head_dim, n_head, n_tokens]
    w = leaf("F32", randn(32), flags=TensorFlag.PARAM)
    out = ops.mul(ops.rms_norm(x, 1e-5), w)
    unfused, fused, n_unfused, n_fused = run_both_ways(out)
    assert (n_unfused, n_fused) == (2, 1)
    assert fused == unfused


@pytest.mark.parametrize("silu_first", [True, False])
def test_silu_of_gate_times_up_fuses_to_the_unfused_bits(silu_first):
    g_np = randn(2, 96, scale=30.0)
    g_np[0, :4] = [-100.0, -88.5, 89.0, 0.0]          # exp(-x) overflows to inf: x/inf = -0
    g, u = leaf("F32", g_np), leaf("F32", randn(2, 96))
    s = ops.silu(g)
    out = ops.mul(s, u) if silu_first else ops.mul(u, s)
    unfused, fused, n_unfused, n_fused = run_both_ways(out)
    assert (n_unfused, n_fused) == (2, 1)
    assert fused == unfused


def test_a_chain_whose_output_overlaps_an_input_out_of_step_does_not_fuse():
    a, b = leaf("F32", randn(4, 64)), leaf("F32", randn(4, 64))
    w = leaf("F32", randn(64), flags=TensorFlag.PARAM)
    out = ops.mul(ops.rms_norm(ops.add(a, b), 1e-6), w)
    # out's rows start one row into a's: writing out's row r would clobber a's row r + 1 before it is read
    shared = HostBuffer.allocate(5 * 64 * 4)
    a.buffer, a.offset, out.buffer, out.offset = shared, 0, shared, 64 * 4
    a_np = randn(4, 64)

    def reset() -> None:
        a.numpy()[...] = a_np
    unfused, fused, n_unfused, n_fused = run_both_ways(out, reset=reset)
    assert (n_unfused, n_fused) == (3, 2)   # add runs alone; rms_norm -> mul, which never reads a, fuses
    assert fused == unfused


def test_a_chain_whose_output_is_exactly_a_dead_input_fuses_to_the_unfused_bits():
    a, b = leaf("F32", randn(4, 64)), leaf("F32", randn(4, 64))
    w = leaf("F32", randn(64), flags=TensorFlag.PARAM)
    out = ops.mul(ops.rms_norm(ops.add(a, b), 1e-6), w)
    out.buffer, out.offset = a.buffer, a.offset       # what the allocator does when a dies at the add
    a_np = a.numpy().copy()

    def reset() -> None:
        a.numpy()[...] = a_np
    unfused, fused, n_unfused, n_fused = run_both_ways(out, reset=reset)
    assert (n_unfused, n_fused) == (3, 1)
    assert fused == unfused


# -- float16 rounding and the KV-cache write ------------------------------------------------------
def f16_bits(bits: np.ndarray) -> np.ndarray:
    return np.array([f32_bits_to_f16_bits(b) for b in bits.tolist()], dtype=np.uint16)


def test_f32_to_f16_bits_rounds_as_numpy_does_at_every_edge():
    edges = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25,
                      2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, np.inf, -np.inf],
                     dtype=np.float32).view(np.uint32)
    nans = np.array([0x7F800001, 0x7FC00000, 0xFF800001, 0x7F802000, 0x7FFFFFFF], dtype=np.uint32)
    randoms = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    for bits in (edges, nans, randoms):
        with np.errstate(over="ignore", invalid="ignore"):
            expected = bits.view(np.float32).astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(f16_bits(bits), expected)


@pytest.mark.parametrize("dst_type", ["F16", "F32"])
def test_set_rows_from_f32_writes_what_numpy_casting_writes(dst_type):
    cache = leaf(dst_type, np.zeros((10, 48), dtype=np.float16 if dst_type == "F16" else np.float32))
    src_np = randn(3, 48, scale=1000.0)
    ids = leaf("I32", np.array([7, 2, 9], dtype=np.int32))
    CPUBackend().compute([ops.set_rows(cache, leaf("F32", src_np), ids)])
    expected = np.zeros((10, 48), dtype=cache.numpy().dtype)
    with np.errstate(over="ignore"):
        expected[[7, 2, 9]] = src_np
    np.testing.assert_array_equal(cache.numpy().reshape(10, 48).view(np.uint8), expected.view(np.uint8))


def test_set_rows_from_f32_rejects_an_id_out_of_range_and_writes_nothing():
    dst = np.zeros((4, 8), np.uint16)
    src = randn(2, 8).view(np.uint32)
    assert not copy_rows_from_f32(dst, src, np.array([1, 4], np.int32), 4)
    assert not dst.any()
    cache = leaf("F16", np.zeros((4, 8), np.float16))
    node = ops.set_rows(cache, leaf("F32", randn(2, 8)), leaf("I32", np.array([0, -1], np.int32)))
    with pytest.raises(BackendError, match="row id -1"):
        CPUBackend().compute([node])


# -- rope: one table per positions and parameters -------------------------------------------------
def test_ropes_over_the_same_positions_share_tables_recomputed_at_every_run():
    pos = leaf("I32", np.array([3, 17], dtype=np.int32), flags=TensorFlag.INPUT)
    q, k = leaf("F32", randn(2, 4, 16)), leaf("F32", randn(2, 2, 16))
    rq, rk = ops.rope(q, pos, 16), ops.rope(k, pos, 16)
    graph = Graph([rq, rk])
    for t in graph.nodes:
        allocate(t)
    plan = CPUBackend().compile(graph.nodes)
    for positions in ([3, 17], [40, 41]):
        pos.numpy()[...] = positions
        plan()
        for rope in (rq, rk):   # each alone: a plan of one rope computes its own table
            alone = ops.rope(rope.src[0], pos, 16)
            allocate(alone)
            CPUBackend().compute([alone])
            np.testing.assert_array_equal(rope.numpy().view(np.uint32), alone.numpy().view(np.uint32))


# -- bound matmuls ----------------------------------------------------------------------------------
@pytest.mark.parametrize("w_type", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16", "F32"])
@pytest.mark.parametrize("n, threads", [(1, 1), (3, 1), (1, 2)])
def test_bound_mul_mat_equals_mul_mat_bit_for_bit(w_type, n, threads):
    # on two threads (512 x 256: enough for a parallel region) a quantized product's parallel calls run qmm.groups'
    # driver as a group of one, its serial ones and mul_mat the template's
    rows, k = (64 if threads == 1 else 512), 256
    w_np = randn(rows, k)
    w = w_np if w_type == "F32" else (w_np.astype(np.float16) if w_type == "F16" else quantize(w_np, w_type))
    pw = qmm.pack_weight(w, w_type)
    x = randn(n, k)
    expected, out = np.empty((n, rows), np.float32), np.empty((n, rows), np.float32)
    qmm.mul_mat(pw, x, expected)
    call = qmm.bind_mul_mat(pw, x, out, n_threads=threads)
    call()
    np.testing.assert_array_equal(out, expected)
    for _ in range(4):                                    # two threads: parallel twice, then serial (thread_choice)
        x[...] = randn(n, k)                              # a bound call reads the array as it is then
        qmm.mul_mat(pw, x, expected)
        call()
        np.testing.assert_array_equal(out, expected)


def test_one_thread_never_starts_a_parallel_region():
    assert not qmm.use_parallel(1 << 30, 1)
    assert qmm.use_parallel(qmm.PARALLEL_MIN_MACS, 2) and not qmm.use_parallel(qmm.PARALLEL_MIN_MACS - 1, 2)


def test_a_plan_runs_fewer_kernels_than_it_has_computing_nodes_on_a_transformer_layer():
    x = leaf("F32", randn(1, 64))
    wn, wg, wu = (leaf("F32", randn(64), flags=TensorFlag.PARAM), leaf("F32", randn(128, 64), flags=TensorFlag.PARAM),
                  leaf("F32", randn(128, 64), flags=TensorFlag.PARAM))
    h = ops.mul(ops.rms_norm(x, 1e-6), wn)
    ffn = ops.mul(ops.mul_mat(wu, h), ops.silu(ops.mul_mat(wg, h)))
    graph = Graph([ffn])
    for t in graph.nodes:
        allocate(t)
    computing = [n for n in graph.nodes if n.op not in PURE_VIEWS]
    assert len(CPUBackend().compile(graph.nodes).kernels) == len(computing) - 2


def test_bound_mul_mats_of_one_plan_share_their_activation_buffers():
    k = 128
    packs = [qmm.pack_weight(quantize(randn(rows, k), "Q4_1"), "Q4_1") for rows in (32, 48)]
    x, y = randn(5, k), randn(5, k)
    outs = [np.empty((5, 32), np.float32), np.empty((5, 48), np.float32)]
    scratch: dict = {}
    calls = [qmm.bind_mul_mat(pw, v, out, 1, scratch) for pw, v, out in zip(packs, (x, y), outs)]
    assert len(scratch) == 1                              # one set of Q8_1 buffers for (5, 128)
    for call in calls:
        call()
    for pw, v, out in zip(packs, (x, y), outs):
        expected = np.empty_like(out)
        qmm.mul_mat(pw, v, expected)
        np.testing.assert_array_equal(out, expected)


def test_products_of_one_x_quantize_it_once_and_again_only_after_another_x(monkeypatch):
    k = 128
    q, kk, o = (qmm.pack_weight(quantize(randn(rows, k), "Q4_1"), "Q4_1") for rows in (32, 16, 48))
    x, y = randn(4, k), randn(4, k)
    quantized = []
    real = qmm._ACTIVATION_QUANTIZERS["Q8_1"]

    def counted(v, *buffers):
        quantized.append(v)
        real(v, *buffers)
    monkeypatch.setitem(qmm._ACTIVATION_QUANTIZERS, "Q8_1", counted)
    outs = [np.empty((4, pw.rows), np.float32) for pw in (q, kk, o, q)]
    scratch: dict = {}
    # a layer's shape: x's q and k products, y's o product in the same buffers, then x's again
    plan = [qmm.bind_mul_mat(pw, v, out, 1, scratch, x_source=src)
            for pw, v, out, src in zip((q, kk, o, q), (x, x, y, x), outs, ("x", "x", "y", "x"))]

    def run_and_check():
        quantized.clear()
        for call in plan:
            call()
        for pw, v, out, _ in zip((q, kk, o, q), (x, x, y, x), outs, plan):
            expected = np.empty_like(out)
            qmm.mul_mat(pw, v, expected)
            np.testing.assert_array_equal(out, expected)
        return [next(name for name, a in (("x", x), ("y", y)) if a is v) for v in quantized]

    assert run_and_check() == ["x", "y", "x"]        # k shares q's quantization; after y's, x's is redone
    x[...] = randn(4, k)                              # the next run's x: its first product quantizes it again
    y[...] = randn(4, k)
    assert run_and_check() == ["x", "y", "x"]
    plan[2:] = []                                     # no other x between: x once per run, even when it changes
    x[...] = randn(4, k)
    assert run_and_check() == ["x"]


def test_activations_an_in_place_op_rewrites_are_quantized_by_each_product_that_reads_them():
    # x's first product, a cpy writing y into x's memory, then a product reading x in plan order after it: it
    # must see y, as it does unshared (the plan runs nodes in order), not the first product's quantization
    k = 64
    w1, w3 = (leaf("Q8_0", quantize(randn(32, k), "Q8_0"), flags=TensorFlag.PARAM) for _ in range(2))
    x = ops.scale(leaf("F32", randn(2, k)), 1.0)
    y = leaf("F32", randn(2, k))
    p1 = ops.mul_mat(w1, x)
    written = ops.cpy(y, x)
    p3 = ops.mul_mat(w3, x)
    graph = Graph([p1, written, p3])
    assert [n for n in graph.nodes if n.op in ("mul_mat", "cpy")] == [p1, written, p3]
    for t in (*graph.leafs, *graph.nodes):
        if t.view_src is None and t.buffer is None:
            allocate(t)
    CPUBackend().compute(graph.nodes)
    expected = np.empty((2, 32), np.float32)
    qmm.mul_mat(qmm.pack_weight(w3.numpy().reshape(32, -1), "Q8_0"), y.numpy().reshape(2, k), expected)
    np.testing.assert_array_equal(p3.numpy().reshape(2, 32), expected)


# -- product groups: products of one activation as one call -------------------------------------------
def group_packs(w_types, rows, k):
    return [qmm.pack_weight(quantize(randn(r, k), t), t) for t, r in zip(w_types, rows)]


@pytest.mark.parametrize("w_type", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0"])
@pytest.mark.parametrize("n", [1, 3, 64])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_bound_product_group_equals_separate_products_bit_for_bit(w_type, n, threads):
    # rows of 2, 3 and 1 tiles: the parallel driver's share of two threads ends inside the second weight
    packs = group_packs([w_type] * 3, (128, 160, 64), 256)
    x = randn(n, 256)
    outs = [np.full((n, pw.rows), np.nan, np.float32) for pw in packs]
    call = qmm.bind_mul_mats(packs, x, outs, n_threads=threads, scratch={}, x_source="x")
    for _ in range(5):             # on two threads: the parallel driver first, then the serial (thread_choice)
        x[...] = randn(n, 256)     # a bound group reads x as it is then
        call()
        for pw, out in zip(packs, outs):
            expected = np.empty_like(out)
            qmm.mul_mat(pw, x, expected)
            np.testing.assert_array_equal(out, expected)


def test_only_weights_of_one_quantized_kind_group_and_at_most_three():
    q4_1, q4_k, q6_k = (group_packs([t], (64,), 256)[0] for t in ("Q4_1", "Q4_K", "Q6_K"))
    f32 = qmm.pack_weight(randn(64, 256), "F32")
    assert qmm.can_group([q4_1, q4_1]) and qmm.can_group([q4_k, q4_k, q4_k])
    assert not qmm.can_group([q4_1]) and not qmm.can_group([q4_1] * (qmm.MAX_GROUP_WEIGHTS + 1))
    assert not qmm.can_group([q4_k, q6_k]) and not qmm.can_group([f32, f32])
    assert not qmm.can_group([q4_1, group_packs(["Q4_1"], (64,), 512)[0]])      # another k
    with pytest.raises(ValueError, match="one quantized kind"):
        qmm.bind_mul_mats([q4_k, q6_k], randn(1, 256), [np.empty((1, 64), np.float32)] * 2)


def qkv_graph(w_types, n_tokens, k=256, rows=(128, 64, 64)):
    """Outputs whose graph has a layer's q, k and v products of one x one after another (the builder's order)."""
    x = ops.scale(leaf("F32", randn(n_tokens, k)), 1.0)
    weights = [leaf(t, quantize(randn(r, k), t), flags=TensorFlag.PARAM) for t, r in zip(w_types, rows)]
    products = [ops.mul_mat(w, x) for w in weights]
    return [*products, *(ops.scale(p, 1.0) for p in products)]   # then read, as rope and the cache writes do


@pytest.mark.parametrize("n_tokens", [1, 5])
def test_products_of_one_activation_in_a_plan_run_as_one_kernel_to_the_separate_bits(n_tokens):
    unfused, fused, n_unfused, n_fused = run_both_ways(*qkv_graph(["Q4_1"] * 3, n_tokens))
    assert fused == unfused
    assert n_fused == n_unfused - 2


def test_a_product_of_another_kind_after_a_group_runs_on_its_own():
    # a Q4_K_M layer: q and k Q4_K, v Q6_K -> q and k grouped, v alone, the same bits
    unfused, fused, n_unfused, n_fused = run_both_ways(*qkv_graph(["Q4_K", "Q4_K", "Q6_K"], 2))
    assert fused == unfused
    assert n_fused == n_unfused - 1


def test_the_graph_builder_puts_a_layers_q_k_and_v_products_side_by_side(tmp_path):
    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    from tests.fixtures import tiny_models
    path = tmp_path / "tiny.gguf"
    tiny_models.write_tiny_model(path, "qwen2", "Q8_0")       # with q, k and v biases
    ctx = Context(Model.load(path), n_ctx=64, backends="cpu")
    ctx.decode(Batch.from_tokens([1, 2, 3, 4]))
    graph = next(reversed(ctx._graphs.values())).graph
    steps = [n for n in graph.nodes if n.op not in PURE_VIEWS]
    i = next(j for j, n in enumerate(steps) if n.op == "mul_mat" and n.src[0].name == "blk.0.attn_q.weight")
    assert [n.src[0].name for n in steps[i:i + 3]] == ["blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                                       "blk.0.attn_v.weight"]
    assert len({n.src[1] for n in steps[i:i + 3]}) == 1
    assert ctx.decode(Batch.from_tokens([5], pos0=4)) == 0     # and the plan that groups them runs
