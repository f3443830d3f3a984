"""rope (normal and neox modes, freq_factors, YaRN): one workgroup per (head, token).

The per-op constants are computed here in float32 as ggml (and the CPU backend) compute them:
theta_scale = powf(freq_base, -2/n_dims), YaRN's correction dims and magnitude scale. The shader builds
each pair's angle by repeated float32 multiplication, as ggml does, rather than by a power.
"""
from __future__ import annotations

import numpy as np

from ggflow.backends_builtin.vulkan.dispatch import Box, Work, box_origin, row_groups, same
from ggflow.backends_builtin.vulkan.kernels import FLOAT_TYPES, BuildContext, OpKernel, addressable, float_suffix
from ggflow.core.ops import ROPE_NEOX, Op
from ggflow.core.tensor import Tensor

F32 = np.float32


def yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: np.float32) -> np.float32:
    turns = F32(n_ctx_orig) / (F32(n_rot) * F32(2.0) * F32(np.pi))
    return F32(n_dims) * np.log(turns) / (F32(2.0) * np.log(base))


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: np.float32, beta_fast: np.float32,
                   beta_slow: np.float32) -> tuple[np.float32, np.float32]:
    with np.errstate(divide="ignore", invalid="ignore"):   # n_ctx_orig 0: YaRN is off, values unused
        low = np.floor(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base))
        high = np.ceil(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base))
    return F32(max(F32(0), low)), F32(min(F32(n_dims - 1), high))


def rope_constants(node: Tensor) -> list[np.float32]:
    n_dims, _, n_ctx_orig = node.op_params[:3]
    base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (F32(p) for p in node.op_params[3:9])
    theta_scale = base ** (F32(-2.0) / F32(n_dims))
    corr_low, corr_high = yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow)
    yarn_mscale = attn_factor * (F32(1.0) + F32(0.1) * np.log(F32(1.0) / freq_scale))
    return [F32(theta_scale), freq_scale, ext_factor, attn_factor, corr_low, corr_high, F32(yarn_mscale)]


def supports_rope(node: Tensor, limits) -> bool:
    a, positions = node.src[:2]
    ok = (a.type.name in FLOAT_TYPES and node.type.name in FLOAT_TYPES and addressable(a)
          and positions.is_contiguous() and a.ne[0] % 2 == 0)
    if len(node.src) > 2:
        ff = node.src[2]
        ok = ok and ff.type.name == "F32" and ff.is_contiguous()
    return ok


def build_rope(node: Tensor, ctx: BuildContext) -> list[Work]:
    a, pos, d = ctx.operand(node.src[0]), ctx.operand(node.src[1]), ctx.operand(node)
    n_dims, mode = node.op_params[:2]
    has_ff = len(node.src) > 2
    ff = ctx.operand(node.src[2]) if has_ff else pos   # unread without factors: any binding will do
    constants = rope_constants(node)
    kind = "neox" if mode == ROPE_NEOX else "normal"
    name = f"rope_{kind}_{float_suffix(node.src[0])}_{float_suffix(node)}"

    def pos_map(box: Box) -> Box:
        return (box[2], (0, 1), (0, 1), (0, 1))

    def push(box: Box, offs: list[int]) -> list:
        return [d.ne[0], *box_origin(box), offs[0], *a.strides(), offs[3], *d.strides(),
                offs[1], offs[2], int(has_ff), n_dims, *constants]
    ff_map = (lambda box: ff.full()) if has_ff else pos_map
    return [Work(ctx.pipeline(name), [a, pos, ff, d], [same, pos_map, ff_map, same], d.full(),
                 row_groups(1), push)]


KERNELS = {Op.ROPE: OpKernel(supports_rope, build_rope)}
