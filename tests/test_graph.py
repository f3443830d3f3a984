"""Graph building: descriptors only, topological order by forward expansion, shape errors that name the op."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core import ops
from ggflow.core.graph import Graph
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.errors import ShapeError, UnknownNameError


def test_building_a_graph_allocates_no_data():
    w = ops.new_tensor("F32", (8, 6), "w", flags=TensorFlag.PARAM)
    x = ops.new_input("F32", (8, 3), "x")
    y = ops.add(ops.mul_mat(w, x), ops.new_tensor("F32", (6,), "b"))
    g = Graph([y])
    assert all(t.buffer is None for t in g.nodes + g.leafs)
    with pytest.raises(ValueError, match="no memory"):
        y.numpy()


def test_nodes_come_after_their_sources_and_side_effects_keep_their_order():
    cache = ops.new_tensor("F32", (4, 16), "cache", flags=TensorFlag.PARAM)
    k = ops.new_input("F32", (4, 2), "k")
    rows = ops.new_input("I32", (2,), "rows")
    write = ops.set_rows(cache, k, rows)
    read = ops.scale(ops.view(cache, (4, 8)), 2.0)
    g = Graph()
    g.expand(write)
    g.mark_output(read)
    order = g.nodes
    assert order.index(write) < order.index(read)
    for i, node in enumerate(order):
        for s in node.src:
            assert s in g.leafs or order.index(s) < i
    assert set(g.leafs) == {cache, k, rows}
    assert g.inputs == [k, rows] or set(g.inputs) == {k, rows}
    assert read.flags & TensorFlag.OUTPUT and not write.flags & TensorFlag.OUTPUT


def test_a_shared_subexpression_appears_once():
    x = ops.new_input("F32", (4,), "x")
    s = ops.silu(x)
    g = Graph([ops.add(s, s), ops.mul(s, s)])
    assert g.nodes.count(s) == 1 and len(g) == 3


def test_deep_graphs_do_not_hit_the_recursion_limit():
    cur = ops.new_input("F32", (4,), "x")
    for _ in range(5000):
        cur = ops.scale(cur, 1.0)
    assert len(Graph([cur])) == 5000


def test_graphs_have_distinct_uids_and_a_dot_rendering():
    x = ops.new_input("F32", (4, 2), "x")
    y = ops.silu(x)
    g1, g2 = Graph([y]), Graph([y])
    assert g1.uid != g2.uid
    dot = g1.to_dot()
    assert dot.startswith("digraph") and f"t{x.id} -> t{y.id}" in dot and "silu" in dot


def test_views_copy_nothing_and_describe_strides():
    a = ops.new_tensor("F32", (6, 4, 2), "a")
    t = ops.transpose(a)
    assert t.ne[:3] == (4, 6, 2) and t.nb[:2] == (a.nb[1], a.nb[0]) and t.view_src is a
    r = ops.reshape(a, 24, 2)
    assert r.ne[:2] == (24, 2) and r.is_contiguous()
    p = ops.permute(a, 2, 0, 1, 3)  # axis 0 -> position 2, ...
    assert p.ne[:3] == (4, 2, 6)
    v = ops.view(a, (6, 2), (a.nb[0], a.nb[1]), offset=a.nb[1] * 2)
    assert v.base() is a and v.base_offset() == 2 * a.nb[1]


def test_quantized_tensor_strides_are_in_blocks():
    # Q4_0: blocks of 32 elements in 18 bytes (an fp16 scale and 16 bytes of nibbles); ggml's nb[0] is the
    # block's size and a row of 64 elements is two blocks
    t = Tensor("Q4_0", (64, 3))
    assert t.nb[0] == 18
    assert t.nb == (18, 36, 108, 108) and t.nbytes == 108


@pytest.mark.parametrize("build, message", [
    (lambda: ops.mul_mat(ops.new_tensor("F32", (8, 6)), ops.new_tensor("F32", (7, 3))), "mul_mat"),
    (lambda: ops.add(ops.new_tensor("F32", (8, 6)), ops.new_tensor("F32", (3,))), "add"),
    (lambda: ops.mul(ops.new_tensor("F32", (8, 6)), ops.new_tensor("F32", (8, 4))), "mul"),
    (lambda: ops.reshape(ops.new_tensor("F32", (8, 6)), 5, 5), "reshape"),
    (lambda: ops.reshape(ops.transpose(ops.new_tensor("F32", (8, 6))), 48), "contiguous"),
    (lambda: ops.get_rows(ops.new_tensor("F32", (8, 6)), ops.new_tensor("F32", (2,))), "I32"),
    (lambda: ops.rope(ops.new_tensor("F32", (8, 2, 3)), ops.new_tensor("I32", (4,)), 8), "rope"),
    (lambda: ops.rope(ops.new_tensor("F32", (8, 2, 3)), ops.new_tensor("I32", (3,)), 8, mode=7), "mode"),
    (lambda: ops.soft_max(ops.new_tensor("F32", (8, 6)), ops.new_tensor("F32", (8, 5))), "soft_max"),
    (lambda: ops.view(ops.new_tensor("F32", (8, 6)), (8, 7)), "view"),
    (lambda: ops.permute(ops.new_tensor("F32", (8, 6)), 0, 0, 1, 2), "permute"),
    (lambda: ops.set_rows(ops.new_tensor("F32", (8, 6)), ops.new_tensor("F32", (8, 2)),
                          ops.new_tensor("I32", (3,))), "set_rows"),
])
def test_bad_shapes_name_the_op_and_the_shapes(build, message):
    with pytest.raises(ShapeError, match=message) as err:
        build()
    assert "[" in str(err.value)  # the shapes are in the message


def test_unknown_type_lists_the_registered_ones():
    with pytest.raises(UnknownNameError, match="I32"):
        Tensor("Q9_9", (32,))


def test_shape_is_checked_at_construction():
    with pytest.raises(ValueError):
        Tensor("F32", (1, 2, 3, 4, 5))
    with pytest.raises(ValueError):
        Tensor("F32", (-1,))
