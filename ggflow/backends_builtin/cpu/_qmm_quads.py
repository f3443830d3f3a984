"""int32 sums of unsigned-byte x signed-byte products, four per 32-bit lane: what ``vpdpbusd`` computes.

The batched matmul (``_qmm_template``) can lay a decoded block of a row tile out as quads: four
consecutive elements of one row as unsigned bytes in one 32-bit lane (``wq[j, r]`` holds elements
4j .. 4j+3 of row r, see ``BlockPieces.decode_quads``). A token's four int8 activations x[4j .. 4j+3],
broadcast as one int32, then meet 16 rows in one multiply-accumulate: AVX512-VNNI's ``vpdpbusd``
does 64 products per instruction where the int16 path (``_qmm_token_sums``) does 32 per two. Every
product fits the instruction's 16-bit intermediate (255 * 128 < 2**15) and the lanes add in 32 bits
without saturation, so the sums are exact: the same integers the int16 paths form, wider. On AVX2
(no VNNI) ``vpmaddubsw`` adds a row's products two by two into int16 lanes, a group's quads are summed
there, and ``vpmaddwd`` widens the result to int32: exact while half a group's products, summed in
absolute value, fit int16 (the pieces' bound; ``BlockPieces.decode_quads``). 64 products in two
instructions instead of the int16 path's four.

The instructions multiply unsigned weight bytes by signed activation bytes: a type with signed values
stores them with a bias (``BlockPieces.quad_bias``: Q6_K's -32..31 as 0..63), which comes out through
the activations' group sums, sum((q + bias) * x) - bias * sum(x), exact in int32.

On x86 with AVX512-VNNI the code calls the instruction's LLVM intrinsic (chosen from the features numba
compiles for, as ``_qmm_pairs`` does); elsewhere plain IR (widen, multiply, add the four products of
each lane), which LLVM lowers as well as the target allows.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ggflow.backends_builtin.cpu._qmm_pairs import _row_pointer, _target_features

LANES = 16                      # int32 lanes of one 512-bit vector
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_SUMS = ir.VectorType(_I32, LANES)
_BYTES = ir.VectorType(_I8, 4 * LANES)
_ZERO = ir.Constant(_SUMS, [0] * LANES)
_SPLAT = ir.Constant(_SUMS, [0] * LANES)
_VNNI = "+avx512vnni"
_I16 = ir.IntType(16)
_PAIRS16 = ir.VectorType(_I16, 2 * LANES)         # 32 int16 lanes: AVX2's pair sums of 16 rows
_HALF8 = ir.VectorType(_I8, 32)
_HALF16 = ir.VectorType(_I16, 16)


@functools.cache
def quads_add_in_int32() -> bool:
    """Whether quad_sums adds every product in int32 lanes (VNNI, plain IR) rather than AVX2's int16 pairs."""
    from numba.core.registry import cpu_target
    features = _target_features(cpu_target.target_context)
    return _VNNI in features or "+avx2" not in features


@functools.cache
def quads_are_exact(bias: int) -> bool:
    """Whether quad_sums is exact for weights biased by ``bias``: always where the products add in 32 bits
    (VNNI, plain IR); on AVX2 vpmaddubsw sums two products in a saturating int16, which a whole signed
    byte's range (bias 128: up to 2 * 255 * 127) overflows, so there the pieces' int16 bound must hold."""
    return bias < 128 or quads_add_in_int32()


def _products(builder, features, w, x):
    """What one quad step adds to an accumulator where there is no VNNI: on AVX2 vpmaddubsw, a row's
    products in two int16 lanes (two each); elsewhere the four products of each int32 lane."""
    if "+avx2" in features:
        fn = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(_HALF16, [_HALF8] * 2))
        halves = []
        for h in range(2):
            sel = ir.Constant(ir.VectorType(_I32, 8), [8 * h + m for m in range(8)])
            wh = builder.bitcast(builder.shuffle_vector(w, w, sel), _HALF8)
            xh = builder.bitcast(builder.shuffle_vector(x, x, sel), _HALF8)
            halves.append(builder.call(fn, [wh, xh]))
        return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
    wide = ir.VectorType(_I32, 4 * LANES)
    prod = builder.mul(builder.zext(builder.bitcast(w, _BYTES), wide), builder.sext(builder.bitcast(x, _BYTES), wide))
    total = None
    for h in range(4):
        part = builder.shuffle_vector(prod, prod, ir.Constant(_SUMS, [4 * m + h for m in range(LANES)]))
        total = part if total is None else builder.add(total, part)
    return total


@intrinsic
def quad_sums(typingctx, wq, x8, i0, ntok, o, j0, nquads, part, g, rows, xs, xg, bias):
    """part[u, g, r] = sum over quads j0 .. j0+nquads-1 and h < 4 of (byte h of wq[j, r] - bias) *
    x8[i0+u, o+4j+h], for tokens u < ntok and rows r < rows.

    wq (quads, rows) int32, each lane four unsigned bytes; x8 (n, k) int8; part (ntok, groups, rows)
    int32; all C-contiguous. ``ntok``, ``rows`` (a multiple of 16) and ``bias`` are literals: the first two
    set how many accumulators are live. A bias comes out as bias * xs[i0+u, xg], xs holding the sums of
    the group's activations (unread when bias is 0).
    """
    arrays_ok = all(isinstance(a, types.Array) and a.layout == "C" and a.ndim == nd and a.dtype == dt
                    for a, nd, dt in ((wq, 2, types.int32), (x8, 2, types.int8), (part, 3, types.int32),
                                      (xs, 2, types.int32)))
    literals_ok = (all(isinstance(a, types.IntegerLiteral) for a in (ntok, rows, bias))
                   and rows.literal_value % LANES == 0)
    if not (arrays_ok and literals_ok and all(isinstance(a, types.Integer) for a in (i0, o, j0, nquads, g, xg))):
        return None
    ntok_value, nvec, bias_value = ntok.literal_value, rows.literal_value // LANES, bias.literal_value

    def codegen(context, builder, sig, args):
        wq_v, x8_v, part_v = args[0], args[1], args[7]
        wqty, x8ty, partty = sig.args[0], sig.args[1], sig.args[7]
        intp = cgutils.intp_t
        i0_v, o_v, j0_v, nq_v, g_v, xg_v = (context.cast(builder, args[k], sig.args[k], types.intp)
                                            for k in (2, 4, 5, 6, 8, 11))
        corrections = []     # per token: bias * the group's activation sum, splat
        for u in range(ntok_value if bias_value else 0):
            xsp = _row_pointer(context, builder, sig.args[10], args[10], builder.add(i0_v, ir.Constant(intp, u)))
            xsum = builder.load(builder.gep(builder.bitcast(xsp, _I32.as_pointer()), [xg_v]))
            scaled = builder.mul(xsum, ir.Constant(_I32, bias_value))
            corrections.append(builder.shuffle_vector(
                builder.insert_element(ir.Constant(_SUMS, ir.Undefined), scaled, ir.Constant(_I32, 0)),
                ir.Constant(_SUMS, ir.Undefined), _SPLAT))
        features = _target_features(context)
        vnni, avx2 = _VNNI in features, "+avx2" in features
        zero = _ZERO if vnni or not avx2 else ir.Constant(_PAIRS16, [0] * (2 * LANES))
        if vnni:
            dot = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(_SUMS, [_SUMS] * 3))
        elif avx2:
            madd = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(
                ir.VectorType(_I32, 8), [_HALF16] * 2))
        for q in range(nvec):   # 16 rows at a time: ntok accumulators stay in registers, even AVX2's 16
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(ntok_value)]
            with cgutils.for_range(builder, nq_v) as loop:
                j = builder.add(j0_v, loop.index)
                wrow = builder.bitcast(_row_pointer(context, builder, wqty, wq_v, j), _SUMS.as_pointer())
                wvec = builder.load(builder.gep(wrow, [ir.Constant(intp, q)]), align=4)
                col = builder.add(o_v, builder.mul(j, ir.Constant(intp, 4)))
                for u in range(ntok_value):
                    xrow = _row_pointer(context, builder, x8ty, x8_v, builder.add(i0_v, ir.Constant(intp, u)), col)
                    xquad = builder.load(builder.bitcast(xrow, _I32.as_pointer()), align=1)
                    xb = builder.shuffle_vector(builder.insert_element(ir.Constant(_SUMS, ir.Undefined), xquad,
                                                                       ir.Constant(_I32, 0)),
                                                ir.Constant(_SUMS, ir.Undefined), _SPLAT)
                    acc = builder.load(accs[u])
                    if vnni:
                        acc = builder.call(dot, [acc, wvec, xb])
                    else:
                        acc = builder.add(acc, _products(builder, features, wvec, xb))
                    builder.store(acc, accs[u])
            for u in range(ntok_value):
                prow = builder.bitcast(_row_pointer(context, builder, partty, part_v, ir.Constant(intp, u), g_v),
                                       _SUMS.as_pointer())
                total = builder.load(accs[u])
                if avx2 and not vnni:     # each row's two int16 pair sums added into its int32 lane
                    halves = []
                    for h in range(2):
                        sel = ir.Constant(ir.VectorType(_I32, 16), [16 * h + m for m in range(16)])
                        halves.append(builder.call(madd, [builder.shuffle_vector(total, total, sel),
                                                          ir.Constant(_HALF16, [1] * 16)]))
                    total = builder.shuffle_vector(halves[0], halves[1], ir.Constant(_SUMS, list(range(16))))
                if bias_value:
                    total = builder.sub(total, corrections[u])
                builder.store(total, builder.gep(prow, [ir.Constant(intp, q)]), align=4)
        return context.get_dummy_value()

    return types.none(wq, x8, i0, ntok, o, j0, nquads, part, g, rows, xs, xg, bias), codegen
