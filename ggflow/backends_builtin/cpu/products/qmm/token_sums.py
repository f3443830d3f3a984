"""int16 group sums of one decoded block for a few tokens at once, every accumulator in a register.

For batches of 3 to PAIRS_MIN_TOKENS - 1 tokens (a decode step of a few parallel sequences) the skeleton
decodes a block of a row tile once, as int16 ``wd[element, row]``, and needs each token's group sums
of ``wd * x``. Written as scalar numba loops, one token at a time, every token re-reads the decoded
block from memory and stores its sums between groups, so four tokens cost about four matvecs.
``token_sums`` writes the vector code as LLVM IR instead: each weight
vector (32 rows of int16) is loaded once and multiplied into every token's accumulators (``vpmullw`` +
``vpaddw`` with 512-bit vectors), which live in registers until the group is done.

The sums wrap modulo 2**16 exactly as the scalar int16 code did (a 16-bit multiply keeps the product's
low 16 bits, a 16-bit add wraps), so the results are the same bits whatever the order; the pieces'
contract is that a group's sum fits int16 anyway.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ggflow.backends_builtin.cpu.products.qmm.pairs import _row_pointer

LANES = 32                       # int16 lanes of one 512-bit vector
_I16 = ir.IntType(16)
_VEC = ir.VectorType(_I16, LANES)
_ZERO = ir.Constant(_VEC, [0] * LANES)
_SPLAT = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)


@intrinsic
def token_sums(typingctx, wd, xq, i0, ntok, o, qk, gsize, part, rows):
    """part[u, g, r] = sum over e < gsize of wd[g*gsize + e, r] * xq[i0 + u, o + g*gsize + e] (int16,
    wrapping), for every group g < qk // gsize, token u < ntok and row r < rows.

    wd (qk, rows) int16; xq (n, k) int16; part (ntok, groups, rows) int16, all C-contiguous.
    ``ntok`` and ``rows`` (a multiple of 32) are literals: they set how many accumulators are live.
    """
    arrays_ok = all(isinstance(a, types.Array) and a.layout == "C" and a.ndim == nd and a.dtype == types.int16
                    for a, nd in ((wd, 2), (xq, 2), (part, 3)))
    literals_ok = (isinstance(ntok, types.IntegerLiteral) and isinstance(rows, types.IntegerLiteral)
                   and rows.literal_value % LANES == 0)
    if not (arrays_ok and literals_ok and all(isinstance(a, types.Integer) for a in (i0, o, qk, gsize))):
        return None
    ntok_value, nvec = ntok.literal_value, rows.literal_value // LANES

    def codegen(context, builder, sig, args):
        wd_v, xq_v, part_v = args[0], args[1], args[7]
        wdty, xqty, partty = sig.args[0], sig.args[1], sig.args[7]
        intp = cgutils.intp_t
        i0_v, o_v, qk_v, gsize_v = (context.cast(builder, args[k], sig.args[k], types.intp) for k in (2, 4, 5, 6))
        accs = [[cgutils.alloca_once(builder, _VEC) for _ in range(nvec)] for _ in range(ntok_value)]
        with cgutils.for_range(builder, builder.sdiv(qk_v, gsize_v)) as groups:
            g = groups.index
            for acc in (a for per_token in accs for a in per_token):
                builder.store(_ZERO, acc)
            first = builder.mul(g, gsize_v)
            with cgutils.for_range(builder, gsize_v) as elements:
                e = builder.add(first, elements.index)
                wrow = builder.bitcast(_row_pointer(context, builder, wdty, wd_v, e), _VEC.as_pointer())
                wvecs = [builder.load(builder.gep(wrow, [ir.Constant(intp, q)]), align=2) for q in range(nvec)]
                col = builder.add(o_v, e)
                for u in range(ntok_value):
                    xrow = _row_pointer(context, builder, xqty, xq_v, builder.add(i0_v, ir.Constant(intp, u)), col)
                    x = builder.load(builder.bitcast(xrow, _I16.as_pointer()), align=2)
                    xb = builder.shuffle_vector(builder.insert_element(ir.Constant(_VEC, ir.Undefined), x,
                                                                       ir.Constant(ir.IntType(32), 0)),
                                                ir.Constant(_VEC, ir.Undefined), _SPLAT)
                    for q in range(nvec):
                        acc = accs[u][q]
                        builder.store(builder.add(builder.load(acc), builder.mul(wvecs[q], xb)), acc)
            for u in range(ntok_value):
                prow = builder.bitcast(_row_pointer(context, builder, partty, part_v, ir.Constant(intp, u), g),
                                       _VEC.as_pointer())
                for q in range(nvec):
                    builder.store(builder.load(accs[u][q]), builder.gep(prow, [ir.Constant(intp, q)]), align=2)
        return context.get_dummy_value()

    return types.none(wd, xq, i0, ntok, o, qk, gsize, part, rows), codegen
