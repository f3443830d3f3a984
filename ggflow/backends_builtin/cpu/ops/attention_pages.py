"""Which of a plan's attention products may skip the cache pages a token cannot see.

ggml's attention over the KV cache is three nodes: kq = mul_mat(K, q), p = soft_max(kq, mask, scale),
kqv = mul_mat(V, p). With a cache shared by several sequences most of K's and V's cells are masked for
each token, and the fixed-order kernel can leave pages of them out (products.fixed_order, "Pages a
token cannot see"), given what the mask says. That is safe for V x P whenever p is the softmax itself
(the skipped probabilities are exact zeros). For K x Q it changes kq at the masked cells (0 there), which
is safe only where nothing but that softmax reads kq: no other node of the plan, not an output. (A node of
another split cannot be seen from here; in the graphs GraphBuilder.attention makes, the softmax is kq's only
reader.)

Where nothing but the chain reads kq and the softmax at all, the three nodes (and the cont that puts kqv's
heads in token order) run as one kernel (ops/attention.py, through fusion.py): ``attention_chains``
finds them.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from ggflow.backends_builtin.cpu.products.fixed_order import SKIP_COLUMNS, SKIP_DEPTH
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor, TensorFlag


def _readers(nodes: Sequence[Tensor]) -> dict[Tensor, list[Tensor]]:
    """tensor -> the nodes that read it, once per reference (as a source, as a view's base)."""
    readers: dict[Tensor, list[Tensor]] = defaultdict(list)
    for node in nodes:
        for src in (*node.src, node.view_src):
            if src is not None:
                readers[src].append(node)
    return readers


def masked_products(nodes: Sequence[Tensor]) -> dict[Tensor, tuple[Tensor, int]]:
    """mul_mat node -> (the mask its tokens' rows follow, SKIP_COLUMNS or SKIP_DEPTH)."""
    readers = _readers(nodes)
    softmax_of = {node.src[0]: node for node in nodes if _masked_softmax(node)}   # kq -> its softmax
    found: dict[Tensor, tuple[Tensor, int]] = {}
    for node in nodes:
        if node.op != Op.MUL_MAT:
            continue
        if _masked_softmax(node.src[1]):                                   # V x P
            found[node] = (node.src[1].src[1], SKIP_DEPTH)
        elif node in softmax_of and readers[node] == [softmax_of[node]] and not node.flags & TensorFlag.OUTPUT:
            found[node] = (softmax_of[node].src[1], SKIP_COLUMNS)                # K x Q
    return found


def _masked_softmax(t: Tensor) -> bool:
    return t.op == Op.SOFT_MAX and len(t.src) > 1 and t.src[1].type.name == "F32"


def attention_chains(nodes: Sequence[Tensor]) -> dict[Tensor, tuple[Tensor, ...]]:
    """kq -> the rest of its chain, (soft_max, V x P) or (soft_max, V x P, the cont of V x P's heads
    permuted to [hd_v, n_head, n_tokens]), where nothing else reads kq, the probabilities, or V x P ahead of
    the cont: no other node of the plan (views included), not an output."""
    readers = _readers(nodes)
    found: dict[Tensor, tuple[Tensor, ...]] = {}
    for node in nodes:
        if node.op != Op.MUL_MAT or not _masked_softmax(node.src[1]):
            continue
        softmax = node.src[1]
        kq = softmax.src[0]
        if not (kq.op == Op.MUL_MAT and readers[kq] == [softmax] and readers[softmax] == [node]
                and not (kq.flags | softmax.flags) & TensorFlag.OUTPUT):
            continue
        found[kq] = (softmax, node)
        heads = readers[node][0] if len(set(readers[node])) == 1 else None    # a view reads twice: src, base
        if (heads is not None and heads.op == Op.PERMUTE and heads.op_params == (0, 2, 1, 3)
                and not (node.flags | heads.flags) & TensorFlag.OUTPUT and len(readers[heads]) == 1):
            cont = readers[heads][0]
            if cont.op == Op.CONT and cont.src[0] is heads:
                found[kq] = (softmax, node, cont)
    return found
