"""The CPU plan's fused chains and bound kernels give the unfused, unbound results bit for bit.

Each test runs one graph twice on the same inputs, once with ``CPUBackend.fuse`` off (one kernel per node)
and once on, and compares the bytes of every node's result; it also checks that the chain did fuse (fewer
kernels in the plan), else the comparison would prove nothing.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu import CPUBackend
from ggflow.backends_builtin.cpu import quant_matmul as qmm
from ggflow.backends_builtin.cpu.c_arith import f32_bits_to_f16_bits
from ggflow.backends_builtin.cpu.kernels_rows import copy_rows_from_f32
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
@pytest.mark.parametrize("w_type", ["Q4_1", "Q8_0", "Q4_K", "F16", "F32"])
def test_bound_mul_mat_equals_mul_mat_bit_for_bit(w_type):
    rows, k = 64, 256
    w_np = randn(rows, k)
    w = w_np if w_type == "F32" else (w_np.astype(np.float16) if w_type == "F16" else quantize(w_np, w_type))
    pw = qmm.pack_weight(w, w_type)
    x = randn(3, k)
    expected, out = np.empty((3, rows), np.float32), np.empty((3, rows), np.float32)
    qmm.mul_mat(pw, x, expected)
    call = qmm.bind_mul_mat(pw, x, out, n_threads=1)
    call()
    np.testing.assert_array_equal(out, expected)
    x[...] = randn(3, k)                                  # a bound call reads the array as it is then
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
