"""Elementwise ops: add and mul (ggml repeat broadcasting), scale, silu, gelu.

One workgroup walks one row (ne[0]) of the output; rows are the y groups, dims 2 x 3 the z groups.
add/mul run in F32 (what the models use); scale, silu and gelu read and write F32 or F16, computing in
F32 and rounding once, as ggml's CPU kernels do. gelu follows the CPU backend's numbers: ggml looks
gelu up in a table indexed by x rounded to F16 and stores the F16 answer, so the shader rounds x to
F16, evaluates the tanh approximation in F32 and rounds the result to F16 (x >= 10 passes through and
x <= -10 gives 0 for F32 inputs, as ggml_vec_gelu_f32 does).
"""
from __future__ import annotations

import numpy as np

from ggflow.backends_builtin.vulkan.dispatch import Box, Work, box_origin, repeat_of, row_groups, same
from ggflow.backends_builtin.vulkan.kernels import FLOAT_TYPES, BuildContext, OpKernel, addressable, float_suffix
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor

ROW_THREADS = 256
MAX_ROW_GROUPS = 64       # groups along one row; longer rows loop


def x_groups(ne0: int) -> int:
    return max(1, min(MAX_ROW_GROUPS, -(-ne0 // ROW_THREADS)))


# -- add, mul --------------------------------------------------------------------------------------------
def supports_binary(node: Tensor, limits) -> bool:
    return all(t.type.name == "F32" and addressable(t) for t in (*node.src, node))


def build_binary(node: Tensor, ctx: BuildContext) -> list[Work]:
    a, b = (ctx.operand(s) for s in node.src)
    d = ctx.operand(node)

    def push(box: Box, offs: list[int]) -> list[int]:
        return [d.ne[0], *box_origin(box),
                offs[0], *a.strides(), offs[1], *b.strides(), *b.ne, offs[2], *d.strides()]
    return [Work(ctx.pipeline(f"binary_{node.op}"), [a, b, d], [same, repeat_of(b.ne), same],
                 d.full(), row_groups(x_groups(d.ne[0])), push)]


# -- scale, silu, gelu ------------------------------------------------------------------------------------
def supports_unary(node: Tensor, limits) -> bool:
    (a,) = node.src
    return a.type.name in FLOAT_TYPES and node.type.name in FLOAT_TYPES and addressable(a) and addressable(node) \
        and a.ne == node.ne


def build_unary(node: Tensor, ctx: BuildContext) -> list[Work]:
    (src,) = node.src
    a, d = ctx.operand(src), ctx.operand(node)
    params = [np.float32(p) for p in node.op_params] if node.op == Op.SCALE else [np.float32(0), np.float32(0)]
    name = f"unary_{node.op}_{float_suffix(src)}_{float_suffix(node)}"

    def push(box: Box, offs: list[int]) -> list:
        return [d.ne[0], *box_origin(box), offs[0], *a.strides(), offs[1], *d.strides(), *params]
    return [Work(ctx.pipeline(name), [a, d], [same, same], d.full(), row_groups(x_groups(d.ne[0])), push)]


KERNELS = {
    Op.ADD: OpKernel(supports_binary, build_binary),
    Op.MUL: OpKernel(supports_binary, build_binary),
    Op.SCALE: OpKernel(supports_unary, build_unary),
    Op.SILU: OpKernel(supports_unary, build_unary),
    Op.GELU: OpKernel(supports_unary, build_unary),
}
