"""int32 sums of int16 products, a pair of elements per 32-bit lane: what ``vpdpwssd`` computes.

The batched matmul (``qmm.template``) decodes a block of a row tile once and multiplies it into
every token. With the block stored as element pairs (``wp[j, 2r + h]`` = element 2j + h of row r,
one 32-bit lane per pair) and a token's activation pair (x[2j], x[2j+1]) broadcast as one int32,
one multiply-accumulate of int16 pairs into int32 lanes does two products of 16 rows: AVX512-VNNI's
``vpdpwssd``, or ``vpmaddwd`` + ``vpaddd`` with AVX512BW only. ``pair_sums`` writes that vector code
itself, as LLVM IR: the group sums of several tokens for one group of a tile, all accumulators in
registers, each weight vector loaded once for the tokens. LLVM's auto-vectorizer does not form it from
scalar numba code (it widens to ``vpmulld``, 2.5x slower than the int16 code it replaced).

On x86 the code calls the instructions' LLVM intrinsics, chosen from the features numba compiles for
(not the host's, should they differ). Plain IR (sign-extend, multiply, add even and odd lanes) would
match the same instructions, but the sums are stored as int16 and InstCombine then narrows plain IR
back to 16-bit multiplies; the intrinsics are opaque to it. Other targets get the plain IR.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16                      # int32 lanes of one 512-bit vector
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_PAIRS = ir.VectorType(_I16, 2 * LANES)
_SUMS = ir.VectorType(_I32, LANES)
_WIDE = ir.VectorType(_I32, 2 * LANES)
_EVEN = ir.Constant(ir.VectorType(_I32, LANES), [2 * m for m in range(LANES)])
_ODD = ir.Constant(ir.VectorType(_I32, LANES), [2 * m + 1 for m in range(LANES)])
_NARROW = ir.VectorType(_I16, LANES)
_ZERO = ir.Constant(_SUMS, [0] * LANES)


def _target_features(context) -> set[str]:
    """The features the module is compiled for ("+avx512vnni", ...): numba's target machine's, not the host's."""
    return set(getattr(context.codegen(), "_tm_features", "").split(","))


@functools.cache
def pairs_are_fast() -> bool:
    """Whether numba's target has AVX-512 (BW), where pair_sums is one vpdpwssd or vpmaddwd per 32
    products. Elsewhere (AVX2) its plain IR becomes shuffles and loses to the int16 tile path 3-4x (1536 x
    576, 64 tokens, one thread, Zen 3: Q8_0 9.7 ms vs 2.7 ms, Q6_K 13.3 vs 4.5)."""
    from numba.core.registry import cpu_target
    return "+avx512bw" in _target_features(cpu_target.target_context)


def _madd_accumulate(builder, features, acc, w, x):
    """acc + (w[2m] * x[2m] + w[2m+1] * x[2m+1]) per int32 lane m.

    VNNI: vpdpwssd; AVX512BW: vpmaddwd + vpaddd; elsewhere plain IR (see the module docstring).
    """
    if "+avx512vnni" in features:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpwssd.512", fnty=ir.FunctionType(_SUMS, [_SUMS] * 3))
        return builder.call(fn, [acc, builder.bitcast(w, _SUMS), builder.bitcast(x, _SUMS)])
    if "+avx512bw" in features:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.pmaddw.d.512", fnty=ir.FunctionType(_SUMS, [_PAIRS] * 2))
        return builder.add(acc, builder.call(fn, [w, x]))
    prod = builder.mul(builder.sext(w, _WIDE), builder.sext(x, _WIDE))
    even = builder.shuffle_vector(prod, prod, _EVEN)
    odd = builder.shuffle_vector(prod, prod, _ODD)
    return builder.add(acc, builder.add(even, odd))


def _row_pointer(context, builder, arrty, arr, *index):
    """Address of arr[index..., 0] as an i8*, from the array's strides."""
    a = context.make_array(arrty)(context, builder, arr)
    strides = cgutils.unpack_tuple(builder, a.strides, arrty.ndim)
    offset = ir.Constant(cgutils.intp_t, 0)
    for idx, stride in zip(index, strides):
        offset = builder.add(offset, builder.mul(idx, stride))
    return builder.gep(builder.bitcast(a.data, ir.IntType(8).as_pointer()), [offset])


@intrinsic
def pair_sums(typingctx, wp, xq, i0, ntok, o, j0, npairs, part, g, rows):
    """part[u, g, r] = sum over pairs j0 .. j0+npairs-1 and h of wp[j, 2r+h] * xq[i0+u, o+2j+h], u < ntok, r < rows.

    wp (pairs, 2 * rows) int16; xq (n, k) int16; part (ntok, groups, rows) int16 (the int32 sums
    truncated: exact where they fit int16), all C-contiguous.
    ``ntok`` and ``rows`` (a multiple of 16) are literals: they set how many accumulators are live.
    """
    arrays_ok = all(isinstance(a, types.Array) and a.layout == "C" and a.ndim == nd and a.dtype == dt
                    for a, nd, dt in ((wp, 2, types.int16), (xq, 2, types.int16), (part, 3, types.int16)))
    literals_ok = (isinstance(ntok, types.IntegerLiteral) and isinstance(rows, types.IntegerLiteral)
                   and rows.literal_value % LANES == 0)
    if not (arrays_ok and literals_ok and all(isinstance(a, types.Integer) for a in (i0, o, j0, npairs, g))):
        return None
    ntok_value, nvec = ntok.literal_value, rows.literal_value // LANES

    def codegen(context, builder, sig, args):
        wp_v, xq_v, i0_v, _, o_v, j0_v, np_v, part_v, g_v, _ = args
        wpty, xqty, partty = sig.args[0], sig.args[1], sig.args[7]
        intp = cgutils.intp_t
        i0_v, o_v, j0_v, np_v, g_v = (context.cast(builder, args[k], sig.args[k], types.intp) for k in (2, 4, 5, 6, 8))
        features = _target_features(context)
        accs = [[cgutils.alloca_once_value(builder, _ZERO) for _ in range(nvec)] for _ in range(ntok_value)]
        with cgutils.for_range(builder, np_v) as loop:
            j = builder.add(j0_v, loop.index)
            wrow = builder.bitcast(_row_pointer(context, builder, wpty, wp_v, j), _PAIRS.as_pointer())
            wvecs = [builder.load(builder.gep(wrow, [ir.Constant(intp, q)]), align=2) for q in range(nvec)]
            col = builder.add(o_v, builder.mul(j, ir.Constant(intp, 2)))
            for u in range(ntok_value):
                xrow = _row_pointer(context, builder, xqty, xq_v, builder.add(i0_v, ir.Constant(intp, u)), col)
                xpair = builder.load(builder.bitcast(xrow, _I32.as_pointer()), align=2)
                xb = builder.bitcast(builder.shuffle_vector(
                    builder.insert_element(ir.Constant(_SUMS, ir.Undefined), xpair, ir.Constant(_I32, 0)),
                    ir.Constant(_SUMS, ir.Undefined), ir.Constant(_SUMS, [0] * LANES)), _PAIRS)
                for q in range(nvec):
                    builder.store(_madd_accumulate(builder, features, builder.load(accs[u][q]), wvecs[q], xb), accs[u][q])
        for u in range(ntok_value):
            prow = builder.bitcast(_row_pointer(context, builder, partty, part_v, ir.Constant(intp, u), g_v),
                                   _NARROW.as_pointer())
            for q in range(nvec):
                # exact: a group's sum fits int16 (the pieces' contract), and int16 is what every
                # accumulate piece reads (int32 input makes numba's int64 sums of them stay int64)
                builder.store(builder.trunc(builder.load(accs[u][q]), _NARROW), builder.gep(prow, [ir.Constant(intp, q)]),
                              align=2)
        return context.get_dummy_value()

    return types.none(wp, xq, i0, ntok, o, j0, npairs, part, g, rows), codegen
