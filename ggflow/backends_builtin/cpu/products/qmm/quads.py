"""int32 sums of unsigned-byte x signed-byte products, four per 32-bit lane: what ``vpdpbusd`` computes.

The batched matmul (``qmm.template``) can lay a decoded block of a row tile out as quads: four
consecutive elements of one row as unsigned bytes in one 32-bit lane (``wq[j, r]`` holds elements
4j .. 4j+3 of row r, see ``BlockPieces.decode_quads``). A token's four int8 activations x[4j .. 4j+3],
broadcast as one int32, then meet 16 rows in one multiply-accumulate: AVX512-VNNI's ``vpdpbusd``
does 64 products per instruction where the int16 path (``qmm.token_sums``) does 32 per two. Every
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
compiles for, as ``qmm.pairs`` does); elsewhere plain IR (widen, multiply, add the four products of
each lane), which LLVM lowers as well as the target allows.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ggflow.backends_builtin.cpu.products.qmm.pairs import _row_pointer, _target_features

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


def _splat(builder, scalar):
    """An int32 broadcast to every lane."""
    return builder.shuffle_vector(builder.insert_element(ir.Constant(_SUMS, ir.Undefined), scalar, ir.Constant(_I32, 0)),
                                  ir.Constant(_SUMS, ir.Undefined), _SPLAT)


def _bias_correction(context, builder, xsty, xs, row, group, bias):
    """bias * xs[row, group] (a group's activation sum), broadcast: what a quad bias adds to each row's sum."""
    xsp = builder.bitcast(_row_pointer(context, builder, xsty, xs, row), _I32.as_pointer())
    return _splat(builder, builder.mul(builder.load(builder.gep(xsp, [group])), ir.Constant(_I32, bias)))


def _dot_kernel(builder, features):
    """(step(acc, w, x) -> acc, the zero accumulator, finish(acc) -> the int32 sums) of one quad step per
    int32 lane: vpdpbusd with AVX512-VNNI; on AVX2 vpmaddubsw into int16 pairs (_products), which finish
    widens and adds with vpmaddwd; elsewhere plain IR, the four products of each lane added in int32."""
    if _VNNI in features:
        dot = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(_SUMS, [_SUMS] * 3))
        return (lambda acc, w, x: builder.call(dot, [acc, w, x])), _ZERO, (lambda acc: acc)
    step = lambda acc, w, x: builder.add(acc, _products(builder, features, w, x))   # noqa: E731
    if "+avx2" not in features:
        return step, _ZERO, (lambda acc: acc)
    madd = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(
        ir.VectorType(_I32, 8), [_HALF16] * 2))

    def finish(total):      # each row's two int16 pair sums added into its int32 lane
        halves = []
        for h in range(2):
            sel = ir.Constant(ir.VectorType(_I32, 16), [16 * h + m for m in range(16)])
            halves.append(builder.call(madd, [builder.shuffle_vector(total, total, sel), ir.Constant(_HALF16, [1] * 16)]))
        return builder.shuffle_vector(halves[0], halves[1], ir.Constant(_SUMS, list(range(16))))
    return step, ir.Constant(_PAIRS16, [0] * (2 * LANES)), finish


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
        corrections = [_bias_correction(context, builder, sig.args[10], args[10],
                                        builder.add(i0_v, ir.Constant(intp, u)), xg_v, bias_value)
                       for u in range(ntok_value if bias_value else 0)]     # per token
        dot_step, zero, finish = _dot_kernel(builder, _target_features(context))
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
                    xb = _splat(builder, xquad)
                    builder.store(dot_step(builder.load(accs[u]), wvec, xb), accs[u])
            for u in range(ntok_value):
                prow = builder.bitcast(_row_pointer(context, builder, partty, part_v, ir.Constant(intp, u), g_v),
                                       _SUMS.as_pointer())
                total = finish(builder.load(accs[u]))
                if bias_value:
                    total = builder.sub(total, corrections[u])
                builder.store(total, builder.gep(prow, [ir.Constant(intp, q)]), align=4)
        return context.get_dummy_value()

    return types.none(wq, x8, i0, ntok, o, j0, nquads, part, g, rows, xs, xg, bias), codegen


# word_quad_sums' forms of packed words (its hbits): 0 nibbles alone, 1 or 2 high bits per byte from a second
# array (_HIGH_MASKS), BIT_MASK fifth bits from one 32-bit mask a block, SIGNED_BYTES whole signed bytes
SIGNED_BYTES = -1         # Q8_0
BIT_MASK = 4              # Q5_0, Q5_1
_HIGH_MASKS = {1: 0x01010101, 2: 0x03030303}      # Q5_K, Q6_K
_LINE = 64
_NIBBLES = ir.Constant(_SUMS, [0x0F0F0F0F] * LANES)
_FOUR = ir.Constant(_SUMS, [4] * LANES)
_SIGN_BITS = ir.Constant(_SUMS, [-0x7F7F7F80] * LANES)     # 0x80808080 as a signed int32
# x * 0x00204081 adds x, x << 7, x << 14 and x << 21: for x < 16 bit h of x lands on bit 8h, the low bit of
# byte h, and no two copies' bits meet (they are 7 apart), so nothing carries
_SPREAD = ir.Constant(_SUMS, [0x00204081] * LANES)
_LOW_NIBBLE = ir.Constant(_SUMS, [0xF] * LANES)
_BYTE_LOW_BITS = ir.Constant(_SUMS, [0x01010101] * LANES)


def _spread_four_bits(builder, bits):
    """Bits 0..3 of each lane to bit 4 of its bytes 0..3 (a quad's fifth bits beside their nibbles)."""
    spread = builder.and_(builder.mul(builder.and_(bits, _LOW_NIBBLE), _SPREAD), _BYTE_LOW_BITS)
    return builder.shl(spread, _FOUR)


def _word_quads(builder, form, wvec, hvec, shifts):
    """The byte quads one vector of packed words holds: [low nibbles, high nibbles] with their high bits
    (hvec, shifted right by shifts[0] / shifts[1]) where the form has them, or [the signed bytes + 128]."""
    if form == SIGNED_BYTES:
        return [builder.xor(wvec, _SIGN_BITS)]
    quads = [builder.and_(wvec, _NIBBLES), builder.and_(builder.lshr(wvec, _FOUR), _NIBBLES)]
    if form in _HIGH_MASKS:
        mask = ir.Constant(_SUMS, [_HIGH_MASKS[form]] * LANES)
        return [builder.or_(quad, builder.shl(builder.and_(builder.lshr(hvec, shift), mask), _FOUR))
                for quad, shift in zip(quads, shifts)]
    if form == BIT_MASK:
        return [builder.or_(quad, _spread_four_bits(builder, builder.lshr(hvec, shift)))
                for quad, shift in zip(quads, shifts)]
    return quads


def _intp_members(context, builder, tupty, tup):
    return [context.cast(builder, v, ty, types.intp)
            for v, ty in zip(cgutils.unpack_tuple(builder, tup, len(tupty)), tupty)]


@intrinsic
def word_quad_sums(typingctx, words, highs, at, x8, i0, ntok, xat, part, rows, hbits, xs, bias, ahead):
    """quad_sums of a packed weight read straight from its 32-bit words: no decoded block in between.

    ``words`` (tiles, blocks, n_words, rows) int32, each lane four quant bytes of a row whose low nibbles
    are the quad of elements ``o_lo + 4j ..`` and whose high nibbles the quad at ``o_hi + 4j``; with
    ``hbits`` (1 or 2, a literal; 0: none) each quad's fifth (and sixth) bits come from ``highs`` (the same
    layout), bits ``hs_lo`` (``hs_hi``) of each byte, ``hbits`` of them, placed at bit 4 of the byte.
    ``hbits`` SIGNED_BYTES (-1): the bytes are whole signed values (Q8_0's), one quad a word with its sign
    bits flipped (+ 128: pass bias 128), summed into g_lo only (o_hi, g_hi, xg_hi unused).
    ``hbits`` BIT_MASK (4): each quad's fifth bits are four consecutive bits of one 32-bit mask a row,
    ``highs[t, b, hm0, r]`` for every j (Q5_0's and Q5_1's qh: bit e for element e), from bit ``hs_lo + 4j``
    (``hs_hi + 4j``), spread to bit 4 of the quad's bytes.
    For tokens u < ntok and rows r < rows (literals), with at = (t, b, m0, n, hm0, hs_lo, hs_hi) and
    xat = (o_lo, o_hi, g_lo, g_hi, xg_lo, xg_hi):

        part[u, g_lo, r] = sum over j < n of quad_lo(words[t, b, m0 + j, r], highs[t, b, hm0 + j, r])
                           . x8[i0 + u, o_lo + 4j ..] - bias * xs[i0 + u, xg_lo]
        part[u, g_hi, r]: the same with the high nibbles, o_hi, xg_hi

    The sums are quad_sums' of the quads decode_quads would have written, so the same integers; what
    this saves is the decoded block's stores and loads, which for one or two tokens cost as much as the
    dot products (a Q4_K matvec in L2 runs in 19 us against the decode-then-sum path's 32: "Matrix
    multiplication kernels" in docs/performance.md). Exact as quad_sums is (on AVX2 half a group's
    products must fit int16, the pieces' bound).
    """
    arrays_ok = all(isinstance(a, types.Array) and a.layout == "C" and a.ndim == nd and a.dtype == dt
                    for a, nd, dt in ((words, 4, types.int32), (highs, 4, types.int32), (x8, 2, types.int8),
                                      (part, 3, types.int32), (xs, 2, types.int32)))
    literals_ok = (all(isinstance(a, types.IntegerLiteral) for a in (ntok, rows, hbits, bias, ahead))
                   and rows.literal_value % LANES == 0
                   and hbits.literal_value in (SIGNED_BYTES, 0, *_HIGH_MASKS, BIT_MASK))
    tuples_ok = all(isinstance(a, types.BaseTuple) and len(a) == c and all(isinstance(m, types.Integer) for m in a)
                    for a, c in ((at, 7), (xat, 6)))
    if not (arrays_ok and literals_ok and tuples_ok and isinstance(i0, types.Integer)):
        return None
    ntok_value, nvec = ntok.literal_value, rows.literal_value // LANES
    hbits_value, bias_value, ahead_value = hbits.literal_value, bias.literal_value, ahead.literal_value

    def codegen(context, builder, sig, args):
        intp = cgutils.intp_t
        words_v, highs_v, x8_v, part_v, xs_v = args[0], args[1], args[3], args[7], args[10]
        wty, hty, x8ty, partty, xsty = sig.args[0], sig.args[1], sig.args[3], sig.args[7], sig.args[10]
        t_v, b_v, m0_v, n_v, hm0_v, hs_lo, hs_hi = _intp_members(context, builder, sig.args[2], args[2])
        o_lo, o_hi, g_lo, g_hi, xg_lo, xg_hi = _intp_members(context, builder, sig.args[6], args[6])
        i0_v = context.cast(builder, args[4], sig.args[4], types.intp)
        features = _target_features(context)
        dot_step, zero, finish = _dot_kernel(builder, features)
        shifts = [_splat(builder, builder.trunc(s, _I32)) for s in (hs_lo, hs_hi)] if hbits_value > 0 else None
        halves = ((o_lo, g_lo, xg_lo), (o_hi, g_hi, xg_hi))[:1 if hbits_value == SIGNED_BYTES else 2]
        prefetch = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
            ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32]))
        # a pass takes as many rows as keep its accumulators in registers: all of them with AVX-512's 32
        # vector registers, 16 at a time on AVX2's 16 (the 512-bit values there are register pairs)
        per_pass = nvec if "+avx512f" in features else 1
        for q0 in range(0, nvec, per_pass):
            qs = range(q0, min(nvec, q0 + per_pass))
            accs = {(h, u, q): cgutils.alloca_once_value(builder, zero)
                    for h in range(len(halves)) for u in range(ntok_value) for q in qs}
            with cgutils.for_range(builder, n_v) as loop:
                j = loop.index
                wrow = builder.bitcast(_row_pointer(context, builder, wty, words_v, t_v, b_v, builder.add(m0_v, j)),
                                       _SUMS.as_pointer())
                if hbits_value > 0:     # BIT_MASK: one mask word a row for the whole call
                    hword = hm0_v if hbits_value == BIT_MASK else builder.add(hm0_v, j)
                    hrow = builder.bitcast(_row_pointer(context, builder, hty, highs_v, t_v, b_v, hword),
                                           _SUMS.as_pointer())
                if ahead_value and q0 == 0:
                    # the same words of the block `ahead` on (past a tile's last block: the next tile's first), a
                    # few lines a step: a bare stream of such tiles runs at 30 GB/s asking for a whole block at its
                    # start, at 48 a few lines a step (docs/performance.md, "Prefetch granularity")
                    b_next = builder.add(b_v, ir.Constant(intp, ahead_value))
                    for arrty, arr, m_v in ((wty, words_v, m0_v), (hty, highs_v, hm0_v))[:1 + (hbits_value in _HIGH_MASKS)]:
                        nxt = _row_pointer(context, builder, arrty, arr, t_v, b_next, builder.add(m_v, j))
                        for line in range(0, rows.literal_value * 4, _LINE):
                            builder.call(prefetch, [builder.gep(nxt, [ir.Constant(intp, line)]), ir.Constant(_I32, 0),
                                                    ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
                shifts_j = shifts
                if hbits_value == BIT_MASK:       # bits hs + 4j .. hs + 4j + 3 of the mask are quad j's
                    four_j = _splat(builder, builder.trunc(builder.mul(j, ir.Constant(intp, 4)), _I32))
                    shifts_j = [builder.add(shift, four_j) for shift in shifts]
                xquads = {}
                for h, (o_v, _, _) in enumerate(halves):
                    col = builder.add(o_v, builder.mul(j, ir.Constant(intp, 4)))
                    for u in range(ntok_value):
                        xrow = _row_pointer(context, builder, x8ty, x8_v, builder.add(i0_v, ir.Constant(intp, u)), col)
                        xquads[h, u] = _splat(builder, builder.load(builder.bitcast(xrow, _I32.as_pointer()), align=1))
                for q in qs:
                    wvec = builder.load(builder.gep(wrow, [ir.Constant(intp, q)]), align=4)
                    hvec = builder.load(builder.gep(hrow, [ir.Constant(intp, q)]), align=4) if hbits_value > 0 else None
                    quads = _word_quads(builder, hbits_value, wvec, hvec, shifts_j)
                    for h in range(len(halves)):
                        for u in range(ntok_value):
                            builder.store(dot_step(builder.load(accs[h, u, q]), quads[h], xquads[h, u]), accs[h, u, q])
            for h, (_, g_v, xg_v) in enumerate(halves):
                for u in range(ntok_value):
                    correction = (_bias_correction(context, builder, xsty, xs_v, builder.add(i0_v, ir.Constant(intp, u)),
                                                   xg_v, bias_value) if bias_value else None)
                    prow = builder.bitcast(_row_pointer(context, builder, partty, part_v, ir.Constant(intp, u), g_v),
                                           _SUMS.as_pointer())
                    for q in qs:
                        total = finish(builder.load(accs[h, u, q]))
                        if correction is not None:
                            total = builder.sub(total, correction)
                        builder.store(total, builder.gep(prow, [ir.Constant(intp, q)]), align=4)
        return context.get_dummy_value()

    return types.none(words, highs, at, x8, i0, ntok, xat, part, rows, hbits, xs, bias, ahead), codegen
