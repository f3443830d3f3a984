"""mul_mat for operands that are not weights (attention's K x Q and V x P over the KV cache), batch-invariant.

out[i3, i2, t, i] = sum over kk of x[i3, i2, t, kk] * a[i3 // r3, i2 // r2, i, kk], each output summed in
one order fixed by a's layout alone: the same for every output element whatever the number of rows
(tokens) in the call, so a token's attention gives the same bits whether it is evaluated alone or in a
batch. BLAS cannot promise that: it picks its kernel (gemv for one row, blocked gemm for many) and so its
summation order by the shape of the call. A last-bit difference matters here: with an F16 cache the
softmax probabilities are rounded to F16 before V x P, and the attention output is quantized to Q8 before
the output projection, so one flipped rounding moves logits by 1e-3..1 (a prompt evaluated in one batch,
then its last token re-evaluated alone after a KV-prefix reuse, gave another greedy answer).

Each product is added with an explicit fused multiply-add (llvm.fma, one rounding, as ggml's SIMD dots do)
and without fastmath, so LLVM keeps each accumulator's operations in program order: vector and scalar
code, the serial and the parallel driver, give the same bits. The two orders:

- a's rows run along kk (K: a row is one cell's head, contiguous): the lane order. Lane l of LANES takes
  kk = l, l + LANES, ... in order into its own float32 accumulator, then the lanes are added in a halving
  tree (l + l+8, + 4, + 2, + 1), as a SIMD dot product does. Each output is a dot along a row of a, read
  where it lies, in blocks of 4 rows of x by 4 rows of a (LLVM vector code, _lane_dots_codegen).
- otherwise (V, whose columns run along kk): one accumulator per output, kk = 0, 1, ... in order,
  vectorized over the output columns i: a is read as tiles tile[kk, i] (F16 widened exactly to float32)
  and each row's accumulators out[t, i0:i0+COLS] take fma(x[kk], tile[kk, :], .) for kk in order.

Like ggml's F16 dot (vec_dot_type F16), x is rounded to F16 first when a is F16.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = np.float32
COLS = 64          # output columns per tile: a tile row (256 bytes) spans whole vectors
DEPTH = 256        # kk per tile (64 KiB, in L2): each row's x is read in runs of 1 KiB, which prefetch well
ROWS = 128         # output rows per task: each tile is filled once for this many rows
GROUP_COLS = 512   # output columns per task: each row's x is loaded once for this many columns
# Below this many multiply-adds (~0.1 ms on one core) a call runs serially: waking the other threads costs
# 10-20 us on an idle machine and a scheduler time slice on a busy one (see threads.py).
PARALLEL_MIN_MACS = 1 << 20
LANES = 16         # partial sums per output where a's rows run along kk (the lane order; one AVX-512 vector)


@intrinsic
def as_f32(typingctx, v):
    """float32 as is; a 16-bit integer as the IEEE half it holds, widened exactly (LLVM fpext)."""
    if isinstance(v, types.Float) and v.bitwidth == 32:
        return types.float32(v), lambda context, builder, sig, args: args[0]
    if isinstance(v, types.Integer) and v.bitwidth == 16:
        def widen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return types.float32(v), widen
    return None


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma): the same bits in vector and scalar code, unlike a contraction
    LLVM may or may not make; and what ggml's SIMD dot products compute."""
    if not all(isinstance(v, types.Float) and v.bitwidth == 32 for v in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)
    return types.float32(a, b, c), codegen


@intrinsic
def round_to_f16(typingctx, v):
    """float32 -> nearest IEEE half (ties to even, as ggml's fp32 -> fp16) -> float32 again."""
    if not (isinstance(v, types.Float) and v.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(v), codegen


@njit(cache=True, fastmath=False, inline="always")
def _fill_tile(a, a_step, ia3, ia2, c0, nc, k0, nk, tile):
    """tile[r, c] = float32 a[ia3, ia2, c0 + c, k0 + r], a given as its memory (1-D) and element steps.

    Where one of a's steps is 1, the copy reads runs of contiguous elements through slices of the 1-D
    array, which LLVM vectorizes (F16 included: vcvtph2ps); numba's strided 4-D indexing stays scalar.
    """
    s3, s2, s_col, s_kk = a_step
    base = ia3 * s3 + ia2 * s2 + c0 * s_col + k0 * s_kk
    if s_kk == 1:                           # rows of a run along kk (K): read a row, write a tile column
        for c in range(nc):
            a_row = a[base + c * s_col:base + c * s_col + nk]
            for r in range(nk):
                tile[r, c] = as_f32(a_row[r])
    elif s_col == 1:                        # columns of a run along kk (V seen transposed): row by row
        for r in range(nk):
            a_row, tile_row = a[base + r * s_kk:base + r * s_kk + nc], tile[r]
            for c in range(nc):
                tile_row[c] = as_f32(a_row[c])
    else:
        for r in range(nk):
            for c in range(nc):
                tile[r, c] = as_f32(a[base + c * s_col + r * s_kk])


@njit(cache=True, fastmath=False, inline="always")
def _load_x(x, i3, i2, t, k0, nk, round_x, xs):
    x_row = x[i3, i2, t, k0:k0 + nk]
    if round_x:
        for r in range(nk):
            xs[r] = round_to_f16(as_f32(x_row[r]))
    else:
        for r in range(nk):
            xs[r] = as_f32(x_row[r])


@njit(cache=True, fastmath=False, inline="always")
def _accumulate_row(o, xs, tile, nk):
    """o[c] = fma(xs[r], tile[r, c], o[c]) for r = 0, 1, ... in order, 4 r per pass over o.

    o is a slice starting at 0: indexed by the loop variable, LLVM can drop numba's negative-index
    wraparound, which otherwise keeps the loop scalar.
    """
    nc = o.shape[0]
    r = 0
    while r + 4 <= nk:
        x0, x1, x2, x3 = xs[r], xs[r + 1], xs[r + 2], xs[r + 3]
        t0, t1, t2, t3 = tile[r], tile[r + 1], tile[r + 2], tile[r + 3]
        for c in range(nc):
            o[c] = fma(x3, t3[c], fma(x2, t2[c], fma(x1, t1[c], fma(x0, t0[c], o[c]))))
        r += 4
    while r < nk:
        x0, t0 = xs[r], tile[r]
        for c in range(nc):
            o[c] = fma(x0, t0[c], o[c])
        r += 1


@njit(cache=True, fastmath=False, inline="always")
def _accumulate_4_rows(o0, o1, o2, o3, xs, tile, nk):
    """_accumulate_row for 4 rows at once (the same operations per element): each tile load feeds 4 FMAs."""
    nc = o0.shape[0]
    r = 0
    while r + 4 <= nk:
        a0, a1, a2, a3 = xs[0, r], xs[0, r + 1], xs[0, r + 2], xs[0, r + 3]
        b0, b1, b2, b3 = xs[1, r], xs[1, r + 1], xs[1, r + 2], xs[1, r + 3]
        c0, c1, c2, c3 = xs[2, r], xs[2, r + 1], xs[2, r + 2], xs[2, r + 3]
        d0, d1, d2, d3 = xs[3, r], xs[3, r + 1], xs[3, r + 2], xs[3, r + 3]
        t0, t1, t2, t3 = tile[r], tile[r + 1], tile[r + 2], tile[r + 3]
        for c in range(nc):
            w0, w1, w2, w3 = t0[c], t1[c], t2[c], t3[c]
            o0[c] = fma(a3, w3, fma(a2, w2, fma(a1, w1, fma(a0, w0, o0[c]))))
            o1[c] = fma(b3, w3, fma(b2, w2, fma(b1, w1, fma(b0, w0, o1[c]))))
            o2[c] = fma(c3, w3, fma(c2, w2, fma(c1, w1, fma(c0, w0, o2[c]))))
            o3[c] = fma(d3, w3, fma(d2, w2, fma(d1, w1, fma(d0, w0, o3[c]))))
        r += 4
    while r < nk:
        t0 = tile[r]
        a0, b0, c0, d0 = xs[0, r], xs[1, r], xs[2, r], xs[3, r]
        for c in range(nc):
            w0 = t0[c]
            o0[c] = fma(a0, w0, o0[c])
            o1[c] = fma(b0, w0, o1[c])
            o2[c] = fma(c0, w0, o2[c])
            o3[c] = fma(d0, w0, o3[c])
        r += 1


@njit(cache=True, fastmath=False, inline="always")
def _b_index(row, ia3, ia2, r3, r2, n):
    """Row number within the b rows that use a's matrix (ia3, ia2) -> (i3, i2, t) in b and out."""
    return ia3 * r3 + row // (r2 * n), ia2 * r2 + row // n % r2, row % n


def _lane_dots_codegen(n_x, n_a, is_half):
    """LLVM vector code for the lane order: n_x rows of xs (from row r) times n_a rows of a (from start, s_col
    apart), the n_x * n_a sums stored in o_i[c:c + n_a] for x row i.

    Per output, LANES accumulators side by side in one vector: lane l takes kk = l, l + LANES, ... by fma,
    in order (a partial last run: lanes below its length, loaded element by element, never past k); then
    a halving tree, t_l = s_l + s_l+8, u_l = t_l + t_l+4, v_l = u_l + u_l+2, sum = v_0 + v_1. For 4 rows of
    a, the 4 trees run as one, the outputs' lanes shuffled side by side: the same adds of the same pairs.
    Vector ops are the per-lane scalar ops side by side, nothing reassociated, so the bits do not depend on
    n_x or n_a. (numba's scalar version of 16 chains stays scalar: LLVM's SLP vectorizer leaves it.)
    """
    def codegen(context, builder, sig, args):
        f32, i8, i64, i32 = ir.FloatType(), ir.IntType(8), ir.IntType(64), ir.IntType(32)
        vec = ir.VectorType(f32, LANES)
        a_elem = ir.HalfType() if is_half else f32
        a_vec = ir.VectorType(a_elem, LANES)

        def as_int(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        def const(v):
            return ir.Constant(i64, v)
        xs = context.make_array(sig.args[0])(context, builder, args[0])
        x_step, x_bytes = builder.extract_value(xs.strides, 0), builder.bitcast(xs.data, i8.as_pointer())
        x_rows = [builder.bitcast(builder.gep(x_bytes, [builder.mul(builder.add(as_int(1), const(i)), x_step)]),
                                  f32.as_pointer()) for i in range(n_x)]
        ap = builder.bitcast(context.make_array(sig.args[2])(context, builder, args[2]).data, a_elem.as_pointer())
        start, s_col, k, c = as_int(3), as_int(4), as_int(5), as_int(6 + n_x)
        a_rows = [builder.gep(ap, [builder.add(start, builder.mul(s_col, const(g)))]) for g in range(n_a)]
        outs = [context.make_array(sig.args[6 + i])(context, builder, args[6 + i]).data for i in range(n_x)]
        fma_v = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec, vec, vec]),
                                               f"llvm.fma.v{LANES}f32")
        widen = (lambda v: builder.fpext(v, vec)) if is_half else (lambda v: v)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for _ in a_rows] for _ in x_rows]

        def accumulate(xvs, avs, keep=None):
            for xv, acc_row in zip(xvs, accs):
                for av, acc in zip(avs, acc_row):
                    old = builder.load(acc)
                    new = builder.call(fma_v, [xv, av, old])
                    builder.store(new if keep is None else builder.select(keep, new, old), acc)

        n_full = builder.udiv(k, const(LANES))
        with cgutils.for_range(builder, n_full) as loop:
            j = builder.mul(loop.index, const(LANES))
            avs = [widen(builder.load(builder.bitcast(builder.gep(row, [j]), a_vec.as_pointer()),
                                      align=2 if is_half else 4)) for row in a_rows]
            accumulate([builder.load(builder.bitcast(builder.gep(row, [j]), vec.as_pointer()), align=4)
                        for row in x_rows], avs)
        j = builder.mul(n_full, const(LANES))
        rest = builder.sub(k, j)
        with builder.if_then(builder.icmp_signed(">", rest, const(0))):
            tails = [(row, cgutils.alloca_once_value(builder, ir.Constant(vec, None))) for row in x_rows]
            tails += [(row, cgutils.alloca_once_value(builder, ir.Constant(a_vec, None))) for row in a_rows]
            with cgutils.for_range(builder, rest) as loop:
                at = builder.add(j, loop.index)
                for src, tail in tails:
                    builder.store(builder.insert_element(builder.load(tail), builder.load(builder.gep(src, [at])),
                                                         loop.index), tail)
            i64s = ir.VectorType(i64, LANES)
            splat = builder.insert_element(ir.Constant(i64s, None), rest, ir.Constant(i32, 0))
            rest_v = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(i32, LANES), [0] * LANES))
            in_tail = builder.icmp_unsigned("<", ir.Constant(i64s, list(range(LANES))), rest_v)
            loaded = [builder.load(tail) for _, tail in tails]
            accumulate(loaded[:n_x], [widen(v) for v in loaded[n_x:]], in_tail)

        def pairs(u, v, lo, hi):
            def pick(idx):
                return builder.shuffle_vector(u, v, ir.Constant(ir.VectorType(i32, len(idx)), idx))
            return builder.fadd(pick(lo), pick(hi))

        for acc_row, o in zip(accs, outs):
            sums = [builder.load(acc) for acc in acc_row]
            if n_a == 1:
                v = sums[0]
                for half in (8, 4, 2, 1):
                    v = pairs(v, v, list(range(half)), list(range(half, 2 * half)))
                builder.store(builder.extract_element(v, ir.Constant(i32, 0)), builder.gep(o, [c]))
                continue
            lo8 = [*range(8), *range(16, 24)]
            t_ab, t_cd = (pairs(sums[g], sums[g + 1], lo8, [i + 8 for i in lo8]) for g in (0, 2))  # 2 outputs each
            lo4 = [i + 8 * g for g in range(4) for i in range(4)]
            u = pairs(t_ab, t_cd, lo4, [i + 4 for i in lo4])                # output g in lanes 4g .. 4g + 3
            lo2 = [i + 4 * g for g in range(4) for i in range(2)]
            v = pairs(u, u, lo2, [i + 2 for i in lo2])
            w = pairs(v, v, [0, 2, 4, 6], [1, 3, 5, 7])                     # output g in lane g
            builder.store(w, builder.bitcast(builder.gep(o, [c]), ir.VectorType(f32, 4).as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


def _lane_dots(n_x, n_a, xs, r, a, start, s_col, k, outs, c):
    """Typing of the _lane_dot intrinsics: (xs 2-D C float32, r, a's memory 1-D float32 or F16 bits,
    start, s_col, k, n_x 1-D C float32 outputs, c) -> None."""
    if not (isinstance(xs, types.Array) and xs.ndim == 2 and xs.dtype == types.float32 and xs.layout == "C"
            and isinstance(a, types.Array) and a.ndim == 1 and a.dtype in (types.float32, types.uint16)
            and all(isinstance(o, types.Array) and o.ndim == 1 and o.dtype == types.float32 and o.layout == "C"
                    for o in outs)
            and all(isinstance(v, types.Integer) for v in (r, start, s_col, k, c))):
        return None
    return types.none(xs, r, a, start, s_col, k, *outs, c), _lane_dots_codegen(n_x, n_a, a.dtype == types.uint16)


@intrinsic
def _lane_dot(typingctx, xs, r, a, start, s_col, k, o, c):
    """o[c] = sum over kk < k of xs[r, kk] * a[start + kk], in the lane order."""
    return _lane_dots(1, 1, xs, r, a, start, s_col, k, (o,), c)


@intrinsic
def _lane_dot4(typingctx, xs, r, a, start, s_col, k, o, c):
    """o[c + g] for the 4 rows of a at start + g * s_col: each run of xs loaded once for 4 rows of a."""
    return _lane_dots(1, 4, xs, r, a, start, s_col, k, (o,), c)


@intrinsic
def _lane_dot4x4(typingctx, xs, r, a, start, s_col, k, o0, o1, o2, o3, c):
    """_lane_dot4 for the rows xs[r .. r + 3] into o0 .. o3: each run of a widened once for 4 rows of xs."""
    return _lane_dots(4, 4, xs, r, a, start, s_col, k, (o0, o1, o2, o3), c)


@njit(cache=True, fastmath=False, inline="always")
def _lane_dots_row(xs, r, a, base, s_col, k, o, g0, g1):
    """o[g0:g1] for one row of xs: 4 rows of a at a time, the rest one by one."""
    c4 = g0 + (g1 - g0) // 4 * 4
    for c in range(g0, c4, 4):
        _lane_dot4(xs, r, a, base + c * s_col, s_col, k, o, c)
    for c in range(c4, g1):
        _lane_dot(xs, r, a, base + c * s_col, s_col, k, o, c)


@njit(cache=True, fastmath=False, inline="always")
def _task_rows_along_kk(a, a_shape, a_step, x, out, round_x, ia3, ia2, g0, g1, row0, row1):
    """a's rows run along kk (K): every output a dot along a row of a, read where it lies, in the lane order.

    Blocks of 4 rows of x times 4 rows of a, whatever the number of rows: the block shapes change which
    vector instructions run, never the operations on each output (see _lane_dots_codegen).
    """
    n_a3, n_a2, m, k = a_shape
    n_b3, n_b2, n, _ = x.shape
    r3, r2 = n_b3 // n_a3, n_b2 // n_a2
    s3, s2, s_col, _ = a_step
    base = ia3 * s3 + ia2 * s2
    xs = np.empty((row1 - row0, k), dtype=F32)
    for row in range(row0, row1):
        i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
        _load_x(x, i3, i2, t, 0, k, round_x, xs[row - row0])
    c4 = g0 + (g1 - g0) // 4 * 4
    row = row0
    while row + 4 <= row1:
        i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
        j3, j2, u = _b_index(row + 1, ia3, ia2, r3, r2, n)
        l3, l2, v = _b_index(row + 2, ia3, ia2, r3, r2, n)
        h3, h2, w = _b_index(row + 3, ia3, ia2, r3, r2, n)
        o0, o1, o2, o3 = out[i3, i2, t], out[j3, j2, u], out[l3, l2, v], out[h3, h2, w]
        for c in range(g0, c4, 4):
            _lane_dot4x4(xs, row - row0, a, base + c * s_col, s_col, k, o0, o1, o2, o3, c)
        for r, o in enumerate((o0, o1, o2, o3)):
            _lane_dots_row(xs, row - row0 + r, a, base, s_col, k, o, c4, g1)
        row += 4
    for row in range(row, row1):
        i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
        _lane_dots_row(xs, row - row0, a, base, s_col, k, out[i3, i2, t], g0, g1)


@njit(cache=True, fastmath=False, inline="always")
def _run_task(a, a_shape, a_step, x, out, round_x, task):
    """One (a matrix, row block, column group); the rows are those of every b matrix that uses a's matrix.

    For each depth block: the rows' x once (rounded, in xs), then per column block one tile of a, read by
    every row. The loops only decide what runs when: each output still takes its kk in order.
    """
    n_a3, n_a2, m, k = a_shape
    n_b3, n_b2, n, _ = x.shape
    r3, r2 = n_b3 // n_a3, n_b2 // n_a2
    n_col_groups = -(-m // GROUP_COLS)
    n_row_blocks = -(-(r3 * r2 * n) // ROWS)
    task = np.int64(task)                   # prange's index may be unsigned: keep the index arithmetic integer
    ia, rest = task // (n_col_groups * n_row_blocks), task % (n_col_groups * n_row_blocks)
    cg, rb = rest // n_row_blocks, rest % n_row_blocks
    ia3, ia2 = ia // n_a2, ia % n_a2
    g0, g1 = cg * GROUP_COLS, min(m, (cg + 1) * GROUP_COLS)
    row0, row1 = rb * ROWS, min(r3 * r2 * n, (rb + 1) * ROWS)
    if a_step[3] == 1:                      # a's rows run along kk (K): the lane order, no transposed tiles
        _task_rows_along_kk(a, a_shape, a_step, x, out, round_x, ia3, ia2, g0, g1, row0, row1)
        return
    tile = np.empty((DEPTH, COLS), dtype=F32)
    xs = np.empty((row1 - row0, DEPTH), dtype=F32)
    for row in range(row0, row1):
        i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
        out[i3, i2, t, g0:g1] = F32(0)
    for k0 in range(0, k, DEPTH):
        nk = min(DEPTH, k - k0)
        for row in range(row0, row1):
            i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
            _load_x(x, i3, i2, t, k0, nk, round_x, xs[row - row0])
        for c0 in range(g0, g1, COLS):
            c1 = min(g1, c0 + COLS)
            _fill_tile(a, a_step, ia3, ia2, c0, c1 - c0, k0, nk, tile)
            row = row0
            while row + 4 <= row1:
                i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
                j3, j2, u = _b_index(row + 1, ia3, ia2, r3, r2, n)
                l3, l2, v = _b_index(row + 2, ia3, ia2, r3, r2, n)
                h3, h2, w = _b_index(row + 3, ia3, ia2, r3, r2, n)
                _accumulate_4_rows(out[i3, i2, t, c0:c1], out[j3, j2, u, c0:c1], out[l3, l2, v, c0:c1],
                                   out[h3, h2, w, c0:c1], xs[row - row0:row - row0 + 4], tile, nk)
                row += 4
            while row < row1:
                i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
                _accumulate_row(out[i3, i2, t, c0:c1], xs[row - row0], tile, nk)
                row += 1


def n_tasks(a_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> int:
    n_a3, n_a2, m, _ = a_shape
    n_b3, n_b2, n, _ = x_shape
    n_rows = (n_b3 // n_a3) * (n_b2 // n_a2) * n
    return n_a3 * n_a2 * -(-m // GROUP_COLS) * -(-n_rows // ROWS)


@njit(cache=True, nogil=True, fastmath=False, parallel=True)
def mul_mat_fixed_order_parallel(a, a_shape, a_step, x, out, round_x, n_tasks):
    """a: the memory of a (A3, A2, m, k) operand, 1-D float32 or F16 bits (uint16), read at element steps
    a_step; x (B3, B2, n, k) float32 or F16 bits, any strides; out (B3, B2, n, m) float32, C-contiguous.
    B3 and B2 are multiples of A3 and A2 (broadcast, GQA). round_x: round x to F16 first (a is F16)."""
    for task in prange(n_tasks):
        _run_task(a, a_shape, a_step, x, out, round_x, task)


@njit(cache=True, nogil=True, fastmath=False)
def mul_mat_fixed_order_serial(a, a_shape, a_step, x, out, round_x, n_tasks):
    for task in range(n_tasks):
        _run_task(a, a_shape, a_step, x, out, round_x, task)


def as_memory(view: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A 4-D view -> (its memory as a 1-D array from its first element, its steps in elements)."""
    steps = tuple(s // view.itemsize for s in view.strides)
    if any(s < 0 or s * view.itemsize != stride for s, stride in zip(steps, view.strides)):
        view = np.ascontiguousarray(view)                  # negative or odd strides: never from ggml views
        steps = tuple(s // view.itemsize for s in view.strides)
    span = 1 + sum((n - 1) * s for n, s in zip(view.shape, steps)) if view.size else 0
    return np.lib.stride_tricks.as_strided(view, (span,), (view.itemsize,)), steps
