"""LLVM-level helpers for the matmul kernels: 16-bit bit-field extraction and 512-bit vectors.

numba computes ``v >> s`` on int16 values in 64 bits. With a constant ``s`` LLVM narrows that back to
16-bit lanes; with a run-time ``s`` (a loop index, or a helper's argument) it cannot, and a vectorized
loop then runs in 64-bit lanes, 4x slower. These intrinsics emit the 16-bit shift directly, so a
helper vectorizes well whether its shift amounts are constants or not, and needs no inlining into
its caller (numba's IR inlining is what made the kernels slow to compile).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
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


@intrinsic
def wide_vectors(typingctx):
    """Let LLVM vectorize the calling function with 512-bit vectors where the CPU has them.

    LLVM's tuning for recent Intel cores (prefer-256-bit) keeps auto-vectorized loops in 256-bit
    registers; on AVX-512 machines the int16 kernels run about 1.2-1.4x faster in 512-bit ones. The
    two function attributes say so for this function only ("min-legal-vector-width" is what makes
    the backend keep 512-bit types whole); on other CPUs they change nothing. llvmlite only accepts
    a fixed list of attribute names, hence adding the strings to the attribute set directly.
    """
    def codegen(context, builder, sig, args):
        attrs = builder.function.attributes
        set.add(attrs, '"prefer-vector-width"="512"')
        set.add(attrs, '"min-legal-vector-width"="512"')
        return context.get_dummy_value()
    return types.none(), codegen


_U32 = np.uint32


@njit(cache=True, inline="always")
def half_word(words, t, b, m, r):
    """16-bit word m of row r (its bytes 2m, 2m+1), as int16, where the quant bytes are kept as 32-bit words (the
    types whose byte quads are read in place: BlockPieces.block_quads)."""
    return np.int16((_U32(words[t, b, m // 2, r]) >> _U32(16 * (m % 2))) & _U32(0xFFFF))


@njit(cache=True, inline="always")
def word_pair(words, t, b, m, r):
    """Words m and m+1 of row r as one uint32: the row's bytes 2m .. 2m+3 in order (for decode_quads,
    whose lanes hold four consecutive bytes of a row)."""
    return _U32(words[t, b, m, r]) | (_U32(words[t, b, m + 1, r]) << _U32(16))
