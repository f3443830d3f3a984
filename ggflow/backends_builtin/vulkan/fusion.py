"""Chains of nodes the Vulkan backend runs as one dispatch: fewer dispatches and barriers per step.

On a GPU a small model's decode step is bound by dispatches, not bytes: an H200 spent about 4 us on each
of a SmolLM2 step's 815 dispatches, an add of 576 floats as long as a matrix product (each waits behind
a barrier for the one before). The chains ggml's backends fuse, as the CPU backend's fusion.py does:

  add(a, b) -> rms_norm -> mul(., w)     shaders/norm_fused.comp (ADD_FIRST): a residual add and the next
  rms_norm -> mul(., w)                  norm with its weight; norm_fused.comp
  silu(g) -> mul(., u) or mul(u, .)      a gated FFN; shaders/silu_mul.comp

All F32 with contiguous rows, a and b (g and u) of the chain's shape, w one row. A fused dispatch writes
every node's result, computed as the unfused shaders compute it (the same bits); an output may alias an
input exactly (each invocation reads an element before it writes it, and only its own), any other overlap
declines the chain.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ggflow.backends_builtin.vulkan.dispatch import (
    Box, Operand, Work, box_origin, repeat_of, row_groups, same, spans_overlap)
from ggflow.backends_builtin.vulkan.kernels import BuildContext
from ggflow.backends_builtin.vulkan.ops_elementwise import x_groups
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor

F32_BYTES = 4


def fused_works(nodes: Sequence[Tensor], i: int, ctx: BuildContext) -> tuple[list[Work], int] | None:
    """The work for the chain that starts at nodes[i] and how many nodes it covers; None: no chain here."""
    for chain in (_add_rms_norm_mul, _rms_norm_mul, _silu_mul):
        found = chain(nodes, i, ctx)
        if found is not None:
            return found
    return None


def _rows_f32(*tensors: Tensor) -> bool:
    return all(t.type.name == "F32" and t.nb[0] == F32_BYTES for t in tensors)


def _other_src(mul: Tensor, x: Tensor) -> Tensor | None:
    """mul's operand beside x, when mul is x * other or other * x."""
    if mul.op != Op.MUL or x not in mul.src:
        return None
    a, b = mul.src
    return b if a is x else a


def _weight_of(mul: Tensor, norm: Tensor) -> Tensor | None:
    w = _other_src(mul, norm)
    if w is None or w.ne != (norm.ne[0], 1, 1, 1) or mul.ne != norm.ne or not _rows_f32(w, norm, mul):
        return None
    return w


def _aliasing_is_safe(operands: Sequence[Operand], written: Sequence[int]) -> bool:
    """Each written operand is disjoint from every other, or the same memory laid out the same way."""
    spans = [(id(op.buffer), *op.span(op.full())) for op in operands]
    for w in written:
        for j, other in enumerate(operands):
            if j == w:
                continue
            exact = (operands[w].buffer is other.buffer and operands[w].offset == other.offset
                     and operands[w].nb == other.nb and operands[w].ne == other.ne)
            if spans_overlap(spans[w], spans[j]) and not exact:
                return False
    return True


def _norm_work(ctx: BuildContext, name: str, norm: Tensor, mul: Tensor, a: Tensor, w: Tensor,
               add: Tensor | None, b: Tensor | None) -> Work | None:
    ops = [ctx.operand(t) for t in (a, norm, w, mul)]
    written = [1, 3]
    if add is not None:
        ops += [ctx.operand(b), ctx.operand(add)]
        written.append(5)
    if not _aliasing_is_safe(ops, written):
        return None
    eps = np.float32(norm.op_params[0])
    rows = [op.strides()[1:] for op in ops]
    a_op, d_op, w_op, z_op = ops[:4]
    extra = [ops[4], ops[5]] if add is not None else []

    def push(box: Box, offs: list[int]) -> list:
        tail = [offs[4], *rows[4], offs[5], *rows[5]] if extra else [0] * 8
        return [d_op.ne[0], *box_origin(box), offs[0], *rows[0], offs[1], *rows[1], offs[2],
                offs[3], *rows[3], *tail, eps]
    maps = [same, same, repeat_of(w_op.ne), same] + [same] * len(extra)
    return Work(ctx.pipeline(name), ops, maps, d_op.full(), row_groups(1), push)


def _rms_norm_mul(nodes: Sequence[Tensor], i: int, ctx: BuildContext) -> tuple[list[Work], int] | None:
    if i + 1 >= len(nodes) or nodes[i].op != Op.RMS_NORM:
        return None
    norm, mul = nodes[i:i + 2]
    (a,) = norm.src
    w = _weight_of(mul, norm)
    if w is None or not _rows_f32(a):
        return None
    work = _norm_work(ctx, "norm_rms_mul", norm, mul, a, w, None, None)
    return None if work is None else ([work], 2)


def _add_rms_norm_mul(nodes: Sequence[Tensor], i: int, ctx: BuildContext) -> tuple[list[Work], int] | None:
    if i + 2 >= len(nodes) or nodes[i].op != Op.ADD:
        return None
    add, norm, mul = nodes[i:i + 3]
    if norm.op != Op.RMS_NORM or norm.src[0] is not add:
        return None
    a, b = add.src
    w = _weight_of(mul, norm)
    if w is None or a.ne != add.ne or b.ne != add.ne or not _rows_f32(a, b, add):
        return None
    work = _norm_work(ctx, "add_norm_rms_mul", norm, mul, a, w, add, b)
    return None if work is None else ([work], 3)


def _silu_mul(nodes: Sequence[Tensor], i: int, ctx: BuildContext) -> tuple[list[Work], int] | None:
    if i + 1 >= len(nodes) or nodes[i].op != Op.SILU:
        return None
    silu, mul = nodes[i:i + 2]
    (g,) = silu.src
    u = _other_src(mul, silu)
    if u is None or not (g.ne == u.ne == silu.ne == mul.ne) or not _rows_f32(g, u, silu, mul):
        return None
    ops = [ctx.operand(t) for t in (g, u, silu, mul)]
    if not _aliasing_is_safe(ops, written=[2, 3]):
        return None
    rows = [op.strides()[1:] for op in ops]

    def push(box: Box, offs: list[int]) -> list:
        return [ops[3].ne[0], *box_origin(box), *(v for k in range(4) for v in (offs[k], *rows[k]))]
    return [Work(ctx.pipeline("silu_mul"), ops, [same] * 4, ops[3].full(), row_groups(x_groups(mul.ne[0])),
                 push)], 2
