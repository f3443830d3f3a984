"""Data movement: get_rows (any weight type -> F32), set_rows (the KV-cache write), cpy and cont.

set_rows also writes the legacy quantized types (a quantized K cache), quantizing as ggml does; cpy and
cont also copy a quantized tensor into one of its own type, bit for bit (the K-shift of such a cache).

get_rows and set_rows index rows by data (the ids), so no box of the output bounds the rows they touch
in the indexed tensor: when that tensor is too large for one binding, it is bound in windows of rows,
one dispatch per window, and each dispatch handles the ids that fall in its window.
"""
from __future__ import annotations

from dataclasses import replace

from ggflow.backends_builtin.vulkan.dispatch import Box, Operand, Work, box_origin, row_groups, same, whole
from ggflow.backends_builtin.vulkan.kernels import (
    FLOAT_TYPES, WEIGHT_TYPES, BuildContext, OpKernel, addressable, float_suffix)
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor
from ggflow.core.types import type_traits

QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")   # set_rows_f32_<type> quantizes into these

THREADS = 128
MAX_ROW_GROUPS = 64


def row_windows(op: Operand, limits) -> list[tuple[int, int]]:
    """Ranges of rows (dim 1) of op that each fit one binding, with room for the offset alignment."""
    lo, hi = op.span(op.full())
    if hi - lo + limits.min_offset_alignment <= limits.max_storage_range:
        return [(0, op.ne[1])]
    per = max(1, (limits.max_storage_range - limits.min_offset_alignment - op.nb[1]) // op.nb[1])
    return [(r, min(r + per, op.ne[1])) for r in range(0, op.ne[1], per)]


def rows_of(op: Operand, lo: int, hi: int) -> Operand:
    return replace(op, offset=op.offset + lo * op.nb[1], ne=(op.ne[0], hi - lo, *op.ne[2:]))


def windowable(t: Tensor, limits) -> bool:
    """Splitting into row windows works for 2-D tensors; a tensor with batches must fit as a whole."""
    return t.nbytes + limits.min_offset_alignment <= limits.max_storage_range or (t.ne[2] == t.ne[3] == 1
                                                                                  and t.nb[1] * 2 <= limits.max_storage_range)


# -- get_rows ------------------------------------------------------------------------------------------------
def supports_get_rows(node: Tensor, limits) -> bool:
    a, ids = node.src
    blocks_ok = a.type.block_size == 1 or a.nb[0] == a.type.type_size
    return (a.type.name in WEIGHT_TYPES and node.type.name == "F32" and blocks_ok and addressable(a)
            and addressable(ids) and windowable(a, limits))


def build_get_rows(node: Tensor, ctx: BuildContext) -> list[Work]:
    src, ids_t = node.src
    a, ids, d = ctx.operand(src), ctx.operand(ids_t), ctx.operand(node)
    per_thread = 1 if src.type.block_size == 1 else 4
    x = max(1, min(MAX_ROW_GROUPS, -(-d.ne[0] // (per_thread * THREADS))))
    pipeline = ctx.pipeline(f"get_rows_{src.type.name.lower()}")

    def ids_map(box: Box) -> Box:
        return (box[1], box[2], box[3], (0, 1))

    works = []
    for lo, hi in row_windows(a, ctx.limits):
        part = rows_of(a, lo, hi)

        def push(box: Box, offs: list[int], lo=lo, hi=hi, part=part) -> list:
            return [d.ne[0], *box_origin(box), offs[0], *part.strides(), offs[1], *ids.strides()[:3],
                    offs[2], *d.strides(), lo, hi]
        works.append(Work(pipeline, [part, ids, d], [whole(part), ids_map, same], d.full(), row_groups(x), push))
    return works


# -- set_rows ------------------------------------------------------------------------------------------------
def supports_set_rows(node: Tensor, limits) -> bool:
    dst, src, ids = node.src
    if node.type.name in QUANTIZABLE:
        dst_ok = src.type.name == "F32" and node.nb[0] == node.type.type_size
    else:
        dst_ok = src.type.name in FLOAT_TYPES and node.type.name in FLOAT_TYPES
    return dst_ok and addressable(src) and addressable(ids) and windowable(dst, limits)


def build_set_rows(node: Tensor, ctx: BuildContext) -> list[Work]:
    _, src_t, ids_t = node.src
    a, ids, d = ctx.operand(src_t), ctx.operand(ids_t), ctx.operand(node)
    if node.type.is_quantized:   # one invocation per block, 64 to a group
        x = -(-a.ne[0] // (node.type.block_size * 64))
        pipeline = ctx.pipeline(f"set_rows_f32_{node.type.name.lower()}")
    else:
        x = max(1, min(MAX_ROW_GROUPS, -(-a.ne[0] // 256)))
        pipeline = ctx.pipeline(f"set_rows_{float_suffix(src_t)}_{float_suffix(node)}")

    def ids_map(box: Box) -> Box:
        return (box[1], (0, 1), (0, 1), (0, 1))

    works = []
    for lo, hi in row_windows(d, ctx.limits):
        part = rows_of(d, lo, hi)

        def push(box: Box, offs: list[int], lo=lo, hi=hi, part=part) -> list:
            return [a.ne[0], *box_origin(box), offs[0], *a.strides()[:2], offs[1], ids.strides()[0],
                    offs[2], *part.strides()[:2], lo, hi]
        works.append(Work(pipeline, [a, ids, part], [same, ids_map, whole(part)], a.full(), row_groups(x), push))
    return works


# -- cpy, cont -----------------------------------------------------------------------------------------------
def supports_copy(node: Tensor, limits) -> bool:
    a = node.src[0]
    if a.type.is_quantized or node.type.is_quantized:   # same type, same shape, whole blocks: bits
        return (a.type.name == node.type.name and a.ne == node.ne and a.nb[0] == a.type.type_size
                and node.nb[0] == node.type.type_size and addressable(a))
    if not (a.type.name in FLOAT_TYPES and node.type.name in FLOAT_TYPES and addressable(a)):
        return False
    if a.ne == node.ne:
        return True
    fits = limits.max_storage_range - limits.min_offset_alignment
    return a.nbytes <= fits and node.nbytes <= fits   # a reshaping copy binds both whole


def as_words(op: Operand) -> Operand:
    """A quantized tensor seen as rows of 16-bit words (a raw copy moves words, whatever they encode)."""
    words = op.type.row_bytes(op.ne[0]) // 2
    return replace(op, type=type_traits("F16"), ne=(words, *op.ne[1:]), nb=(2, *op.nb[1:]))


def build_copy(node: Tensor, ctx: BuildContext) -> list[Work]:
    src = node.src[0]
    a, d = ctx.operand(src), ctx.operand(node)
    reshape = a.ne != d.ne
    if node.type.is_quantized:
        a, d = as_words(a), as_words(d)
        name = "copy_raw16"
    else:
        name = f"copy_{'reshape_' if reshape else ''}{float_suffix(src)}_{float_suffix(node)}"
    x = max(1, min(MAX_ROW_GROUPS, -(-d.ne[0] // 256)))

    def push(box: Box, offs: list[int]) -> list:
        return [d.ne[0], *box_origin(box), offs[0], *a.strides(), offs[1], *d.strides(),
                a.ne[0], a.ne[1], a.ne[2], d.ne[1], d.ne[2]]
    a_map = whole(a) if reshape else same
    return [Work(ctx.pipeline(name), [a, d], [a_map, same], d.full(), row_groups(x), push)]


KERNELS = {
    Op.GET_ROWS: OpKernel(supports_get_rows, build_get_rows),
    Op.SET_ROWS: OpKernel(supports_set_rows, build_set_rows),
    Op.CPY: OpKernel(supports_copy, build_copy),
    Op.CONT: OpKernel(supports_copy, build_copy),
}
