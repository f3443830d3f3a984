"""mul_mat: F32, F16 and quantized weights (Q4_0..Q8_0, Q2_K..Q6_K) read from their GGUF blocks.

ggml_mul_mat(a [k, m, A2, A3], b [k, n, B2, B3]) -> d [m, n, B2, B3]; b's matrix (i2, i3) meets a's
matrix (i2 / (B2/A2), i3 / (B3/A3)), which is how attention's query heads share K/V heads (GQA). a may
be any strided float view (the KV cache, permuted), or a quantized weight with whole blocks per row.

Numerics follow ggml (and the CPU backend): the activations b are first rounded to a's vec_dot_type:
Q8_0/Q8_1/Q8_K for quantized weights and F16 for a model's F16 weights, by a round_act pass into a
scratch buffer (skipped when the previous mul_mat of the split already rounded the same b the same way:
Q, K and V share their input); F16 for attention over an F16 cache as the kernels read b (a row of K is
64-128 values: rounding inline costs less than a dispatch). The dot products then run in F32. Q4_1 and
Q5_1 multiply their block minimum by Q8_1's per-block sum s = f16(d * sum(q)), not by the sum of the
rounded values: round_act writes the difference per block and the kernels add minimum * difference.

Few columns of b (decode) take the matrix-vector kernel, one workgroup per output; more take the tiled
kernel (64 x 64 tiles). Both address a box of d, so dispatch.fit can split a product whose weight is
larger than one binding allows (the LM head of a large vocabulary) into slices of rows.
"""
from __future__ import annotations

from ggflow.backends_builtin.vulkan.dispatch import (
    Box, Operand, Work, box_origin, extent, row_groups, same)
from ggflow.backends_builtin.vulkan.kernels import WEIGHT_TYPES, BuildContext, OpKernel, addressable
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor, TensorFlag, contiguous_strides
from ggflow.core.types import type_traits

VEC_MAX_COLUMNS = 4          # up to this many columns of b, the matrix-vector kernel
VEC_THREADS = 128            # mul_mat_vec's workgroup: one row per subgroup
TILE = 64
ROUNDING = {"Q8_0": "q8_0", "Q8_1": "q8_1", "Q8_K": "q8_k"}
ROUNDING_BLOCK = {"q8_0": 32, "q8_1": 32, "q8_k": 256, "f16": 1}
PREROUND_F16_WEIGHTS = True   # False: F16 weights round b inline too (bench_vulkan.py compares the two)
DELTA_ALIGNMENT = 256      # where the per-block deltas of a q8_1 rounding start in the scratch


def vec_rows_per_group(subgroup_size: int) -> int:
    """Rows of a one mul_mat_vec workgroup covers: as many as it has subgroups, by the reported size."""
    return max(1, VEC_THREADS // max(1, subgroup_size))


def rounding_of(a: Tensor) -> str | None:
    """The round_act variant a's vec_dot_type needs (None: b is read as is, or rounded inline to F16)."""
    if a.type.name == "F16":
        return "f16" if PREROUND_F16_WEIGHTS and a.flags & TensorFlag.PARAM else None
    kind = ROUNDING.get(a.type.vec_dot_type) if a.type.is_quantized else None
    if kind is None or a.ne[0] % ROUNDING_BLOCK[kind]:
        return None   # ggml rounds only whole blocks; the CPU backend leaves other rows as they are
    return kind


def supports_mul_mat(node: Tensor, limits) -> bool:
    a, b = node.src
    if a.type.name not in WEIGHT_TYPES or b.type.name != "F32" or not (addressable(a) and addressable(b)):
        return False
    if a.type.is_quantized and (a.nb[0] != a.type.type_size or a.ne[0] % 16):
        return False   # the kernels read whole blocks along a row, 16 values at a time
    return a.nb[1] * 2 <= limits.max_storage_range   # slices of rows of a must fit a binding


def scratch_bytes(node: Tensor) -> int:
    a, b = node.src
    kind = rounding_of(a)
    if kind is None:
        return 0
    return delta_offset(b.nelements) + (b.nelements // 32 * 4 if kind == "q8_1" else 0)


def delta_offset(n_values: int) -> int:
    return -(-n_values * 4 // DELTA_ALIGNMENT) * DELTA_ALIGNMENT


def f32_operand(buffer, offset: int, ne: tuple[int, int, int, int]) -> Operand:
    f32 = type_traits("F32")
    return Operand(buffer, offset, f32, ne, contiguous_strides(f32, ne))


def build_mul_mat(node: Tensor, ctx: BuildContext) -> list[Work]:
    a_t, b_t = node.src
    a, b, d = ctx.operand(a_t), ctx.operand(b_t), ctx.operand(node)
    works: list[Work] = []
    kind = rounding_of(a_t)
    delta = None
    if kind is not None:
        rounded = f32_operand(ctx.scratch, 0, b.ne)
        if kind == "q8_1":
            delta = f32_operand(ctx.scratch, delta_offset(b_t.nelements), (b.ne[0] // 32, *b.ne[1:]))
        if ctx.state.get("rounded") != (b_t.id, kind):
            works.append(round_work(kind, b, rounded, delta, ctx))
            ctx.state["rounded"] = (b_t.id, kind)
        b = rounded
    works.append(matmul_work(a_t, a, b, d, delta, ctx, prerounded=kind == "f16"))
    return works


def per_block(box: Box) -> Box:
    """The blocks of 32 a box of values (along dim 0) touches."""
    return ((box[0][0] // 32, -(-box[0][1] // 32)), box[1], box[2], box[3])


def round_work(kind: str, src: Operand, dst: Operand, delta: Operand | None, ctx: BuildContext) -> Work:
    operands, maps = [src, dst], [same, same]
    if delta is not None:
        operands.append(delta)
        maps.append(per_block)

    def push(box: Box, offs: list[int]) -> list[int]:
        e = [offs[2], *delta.strides()[1:]] if delta is not None else [0, 0, 0, 0]
        return [src.ne[0], *box_origin(box), offs[0], *src.strides(), offs[1], *dst.strides(), *e]
    x = -(-src.ne[0] // 256)
    return Work(ctx.pipeline(f"round_act_{kind}"), operands, maps, src.full(), row_groups(x), push)


def matmul_work(a_t: Tensor, a: Operand, b: Operand, d: Operand, delta: Operand | None,
                ctx: BuildContext, prerounded: bool = False) -> Work:
    k = a.ne[0]
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    vec = d.ne[1] <= VEC_MAX_COLUMNS

    def a_map(box: Box) -> Box:
        return ((0, k), box[0], (box[2][0] // r2, (box[2][1] - 1) // r2 + 1),
                (box[3][0] // r3, (box[3][1] - 1) // r3 + 1))

    def b_map(box: Box) -> Box:
        return ((0, k), box[1], box[2], box[3])

    rows = vec_rows_per_group(ctx.limits.subgroup_size)
    tile_m = rows if vec else TILE

    def groups(box: Box) -> tuple[int, int, int]:
        batches = extent(box[2]) * extent(box[3])
        return -(-extent(box[0]) // tile_m), -(-extent(box[1]) // (1 if vec else TILE)), batches

    operands, maps = [a, b, d], [a_map, b_map, same]
    if delta is not None:
        operands.append(delta)
        maps.append(lambda box: ((0, delta.ne[0]), box[1], box[2], box[3]))

    def push(box: Box, offs: list[int]) -> list[int]:
        e = [offs[3], *delta.strides()[1:]] if delta is not None else [0, 0, 0, 0]
        return [k, box[0][0], box[0][1], box[1][0], box[1][1], box[2][0], box[3][0], extent(box[2]), r2, r3,
                offs[0], *a.strides(), offs[1], *b.strides(), offs[2], *d.strides(), rows, *e]
    kernel = "mul_mat_vec" if vec else "mul_mat_tiled"
    step = (rows, 1, 1, 1) if vec else (TILE, TILE, 1, 1)
    name = f"{kernel}_{a_t.type.name.lower()}{'_prerounded' if prerounded else ''}"
    return Work(ctx.pipeline(name), operands, maps, d.full(), groups, push, step)


KERNELS = {Op.MUL_MAT: OpKernel(supports_mul_mat, build_mul_mat, scratch_bytes)}
