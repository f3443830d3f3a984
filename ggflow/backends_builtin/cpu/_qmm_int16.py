"""16-bit bit-field extraction for the matmul kernels, as LLVM intrinsics.

numba computes ``v >> s`` on int16 values in 64 bits. With a constant ``s`` LLVM narrows that back to
16-bit lanes; with a run-time ``s`` (a loop index, or a helper's argument) it cannot, and a vectorized
loop then runs in 64-bit lanes, 4x slower. These intrinsics emit the 16-bit shift directly, so a
helper vectorizes well whether its shift amounts are constants or not, and needs no inlining into
its caller (numba's IR inlining is what made the kernels slow to compile).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I16 = ir.IntType(16)


def _as_i16(builder, value, ty):
    if ty.bitwidth > 16:
        return builder.trunc(value, _I16)
    if ty.bitwidth < 16:
        return builder.sext(value, _I16) if ty.signed else builder.zext(value, _I16)
    return value


@intrinsic
def field(typingctx, v, shift, mask):
    """(v >> shift) & mask on int16 (arithmetic shift; mask keeps the field non-negative)."""
    if not all(isinstance(a, types.Integer) for a in (v, shift, mask)):
        return None

    def codegen(context, builder, sig, args):
        a, s, m = (_as_i16(builder, x, t) for x, t in zip(args, sig.args))
        return builder.and_(builder.ashr(a, s), m)
    return types.int16(v, shift, mask), codegen


@intrinsic
def bit_to(typingctx, v, src, dst):
    """Bit ``src`` of v moved to bit ``dst``, int16."""
    if not all(isinstance(a, types.Integer) for a in (v, src, dst)):
        return None

    def codegen(context, builder, sig, args):
        a, s, d = (_as_i16(builder, x, t) for x, t in zip(args, sig.args))
        return builder.shl(builder.and_(builder.ashr(a, s), ir.Constant(_I16, 1)), d)
    return types.int16(v, src, dst), codegen


@intrinsic
def sext8(typingctx, v, byte):
    """Byte ``byte`` (0 = low) of the int16 v as a signed int8 value, widened to int16."""
    if not all(isinstance(a, types.Integer) for a in (v, byte)):
        return None

    def codegen(context, builder, sig, args):
        a, b = (_as_i16(builder, x, t) for x, t in zip(args, sig.args))
        eight = ir.Constant(_I16, 8)
        up = builder.shl(a, builder.sub(eight, builder.mul(b, eight)))
        return builder.ashr(up, eight)
    return types.int16(v, byte), codegen
