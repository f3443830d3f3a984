"""rms_norm, norm and soft_max: one workgroup per row, reductions in shared memory, F32.

ggml sums these rows in double on the CPU; the shaders sum in float in a tree, which differs from it
in the last bits only (well inside the tolerance the tests state).
"""
from __future__ import annotations

import numpy as np

from ggflow.backends_builtin.vulkan.dispatch import Box, Work, box_origin, broadcast_range, row_groups, same
from ggflow.backends_builtin.vulkan.kernels import BuildContext, OpKernel, addressable
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor


# -- rms_norm, norm --------------------------------------------------------------------------------------
def supports_norm(node: Tensor, limits) -> bool:
    (a,) = node.src
    return a.type.name == "F32" and node.type.name == "F32" and addressable(a)


def build_norm(node: Tensor, ctx: BuildContext) -> list[Work]:
    a, d = ctx.operand(node.src[0]), ctx.operand(node)
    eps = np.float32(node.op_params[0])
    name = "norm_rms" if node.op == Op.RMS_NORM else "norm_layer"

    def push(box: Box, offs: list[int]) -> list:
        return [d.ne[0], *box_origin(box), offs[0], *a.strides(), offs[1], *d.strides(), eps]
    return [Work(ctx.pipeline(name), [a, d], [same, same], d.full(), row_groups(1), push)]


# -- soft_max ----------------------------------------------------------------------------------------------
def supports_soft_max(node: Tensor, limits) -> bool:
    a = node.src[0]
    ok = a.type.name == "F32" and node.type.name == "F32" and addressable(a)
    if len(node.src) > 1:
        mask = node.src[1]
        ok = ok and mask.type.name in ("F32", "F16") and addressable(mask)
    return ok


def build_soft_max(node: Tensor, ctx: BuildContext) -> list[Work]:
    a, d = ctx.operand(node.src[0]), ctx.operand(node)
    scale = np.float32(node.op_params[0])
    if len(node.src) > 1:
        m = ctx.operand(node.src[1])
        name, has_mask = f"soft_max_{m.type.name.lower()}", 1

        def mask_map(box: Box) -> Box:
            return ((0, m.ne[0]), box[1], broadcast_range(box[2], m.ne[2]), broadcast_range(box[3], m.ne[3]))
    else:  # the shader reads no mask; bind a in its place
        m, name, has_mask, mask_map = a, "soft_max_f32", 0, same

    def push(box: Box, offs: list[int]) -> list:
        return [d.ne[0], *box_origin(box), offs[0], *a.strides(),
                offs[1], *m.strides(), m.ne[2], m.ne[3], has_mask, offs[2], *d.strides(), scale]
    return [Work(ctx.pipeline(name), [a, m, d], [same, mask_map, same], d.full(), row_groups(1), push)]


KERNELS = {
    Op.RMS_NORM: OpKernel(supports_norm, build_norm),
    Op.NORM: OpKernel(supports_norm, build_norm),
    Op.SOFT_MAX: OpKernel(supports_soft_max, build_soft_max),
}
