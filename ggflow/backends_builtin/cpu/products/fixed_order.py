"""mul_mat for operands that are not weights (attention's K x Q and V x P over the KV cache), batch-invariant.

out[i3, i2, t, i] = sum over kk of x[i3, i2, t, kk] * a[i3 // r3, i2 // r2, i, kk], added one kk after the
other into a float32 accumulator, from kk = 0 up: the same order for every output element whatever the
number of rows (tokens) in the call, so a token's attention gives the same bits whether it is evaluated
alone or in a batch. BLAS cannot promise that: it picks its kernel (gemv for one row, blocked gemm for
many) and so its summation order by the shape of the call. A last-bit difference matters here: with an F16
cache the softmax probabilities are rounded to F16 before V x P, and the attention output is quantized to
Q8 before the output projection, so one flipped rounding moves logits by 1e-3..1 (a prompt evaluated in
one batch, then its last token re-evaluated alone after a KV-prefix reuse, gave another greedy answer).

Each product is added with an explicit fused multiply-add (llvm.fma, one rounding, as ggml's SIMD dots do)
and without fastmath, so LLVM keeps each accumulator's operations in program order: vector and scalar
code, the serial and the parallel driver, give the same bits. It vectorizes over the output columns i
instead: a is read as tiles tile[kk, i] (F16 widened exactly to float32, transposed where a's rows run
along kk, as K's do), and each row's accumulators out[t, i0:i0+COLS] take fma(x[kk], tile[kk, :], .) for
kk in order. Like ggml's F16 dot (vec_dot_type F16), x is rounded to F16 first when a is F16.

Pages a token cannot see. Attention over a cache that several sequences share reads every cell for every
token, though a token sees only its own sequence's cells (the mask's zeros; ``-inf`` elsewhere). Given
which PAGE-cell pages each token sees at all (``live[t, page]``, from the mask: ``pages_live``), the
kernel skips the others, with results unchanged bit for bit:
  SKIP_COLUMNS (K x Q, cells along the output columns): a page's columns are left 0 for that token. Those
      scores only reach the softmax, which adds the mask's -inf to them: exp gives 0 whatever they were.
  SKIP_DEPTH (V x P, cells along kk): a page's terms are left out of that token's sums. Its probabilities
      are exactly 0 (exp(-inf)), and fma(0, v, acc) is acc: the accumulator starts at +0.0 and a sum that
      comes back to zero is +0.0 (round to nearest), so it is never -0.0, the one value adding +-0 changes.
A token that sees no page at all (a row masked everywhere: NaN in ggml) has every page marked live.
The serving cache keeps each sequence's cells in pages of this size (core/memory.py CELL_PAGE), so that
most pages belong to one sequence.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ggflow.backends_builtin.cpu.products.qmm.floats import round_f32_to_f16

F32 = np.float32
COLS = 64          # output columns per tile: a tile row (256 bytes) spans whole vectors
DEPTH = 256        # kk per tile (64 KiB, in L2): each row's x is read in runs of 1 KiB, which prefetch well
ROWS = 128         # output rows per task: each tile is filled once for this many rows
GROUP_COLS = 512   # output columns per task: each row's x is loaded once for this many columns
# Below this many multiply-adds (~0.1 ms on one core) a call runs serially: waking the other threads costs
# 10-20 us on an idle machine and a scheduler time slice on a busy one (see threads.py).
PARALLEL_MIN_MACS = 1 << 20
BLOCK = 16         # a's rows along kk are transposed into tiles in BLOCK x BLOCK blocks (_transpose_block)
PAGE = COLS        # cells per page for the skips: one K x Q column tile; DEPTH holds DEPTH // PAGE of them
NO_SKIP, SKIP_COLUMNS, SKIP_DEPTH = 0, 1, 2
NO_PAGES = np.ones((1, 1), np.uint8)   # the live argument where nothing is skipped


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


ROW_BLOCK = 64     # fma_row's columns per register block: 8 vectors of 8 floats (AVX2's 16 registers hold them)


@intrinsic
def fma_row(typingctx, o, xs, tile, nk):
    """o[c] = fma(xs[r], tile[r, c], o[c]) for r = 0 .. nk-1 in order, every c < len(o) (a multiple of
    ROW_BLOCK): _accumulate_row's operations, with each block of o's columns held in registers for the
    whole run of r (numba's loop stores o back after every r: LLVM cannot tell o from tile). The same
    per-element fma chains (llvm.fma on vectors is the scalar fma lane by lane), so the same bits.

    o and xs 1-D, tile 2-D with contiguous rows, all float32."""
    f32arr = [isinstance(a, types.Array) and a.dtype == types.float32 for a in (o, xs, tile)]
    if not (all(f32arr) and o.ndim == 1 and xs.ndim == 1 and tile.ndim == 2 and o.layout == "C"
            and tile.layout == "C" and isinstance(nk, types.Integer)):
        return None
    width = 8

    def codegen(context, builder, sig, args):
        f32, i8, intp = ir.FloatType(), ir.IntType(8), cgutils.intp_t
        vec = ir.VectorType(f32, width)
        fma_v = builder.module.declare_intrinsic(f"llvm.fma.v{width}f32", fnty=ir.FunctionType(vec, [vec] * 3))
        o_arr = context.make_array(sig.args[0])(context, builder, args[0])
        x_arr = context.make_array(sig.args[1])(context, builder, args[1])
        t_arr = context.make_array(sig.args[2])(context, builder, args[2])
        nk_v = context.cast(builder, args[3], sig.args[3], types.intp)
        n_cols = builder.extract_value(o_arr.shape, 0)
        x_step = builder.extract_value(x_arr.strides, 0)
        row_bytes = builder.extract_value(t_arr.strides, 0)
        o_ptr = builder.bitcast(o_arr.data, f32.as_pointer())
        x_base = builder.bitcast(x_arr.data, i8.as_pointer())
        t_base = builder.bitcast(t_arr.data, i8.as_pointer())
        n_blocks = builder.udiv(n_cols, ir.Constant(intp, ROW_BLOCK))
        with cgutils.for_range(builder, n_blocks) as blocks:
            c0 = builder.mul(blocks.index, ir.Constant(intp, ROW_BLOCK))
            o_vecs = [builder.bitcast(builder.gep(o_ptr, [builder.add(c0, ir.Constant(intp, width * v))]),
                                      vec.as_pointer()) for v in range(ROW_BLOCK // width)]
            accs = [cgutils.alloca_once_value(builder, builder.load(p, align=4)) for p in o_vecs]
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
            with cgutils.for_range(builder, nk_v) as rows:
                r = rows.index
                x = builder.load(builder.bitcast(builder.gep(x_base, [builder.mul(r, x_step)]), f32.as_pointer()))
                xb = builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0)), undef, splat)
                t_row = builder.bitcast(builder.gep(t_base, [builder.mul(r, row_bytes)]), f32.as_pointer())
                for v, acc in enumerate(accs):
                    at = builder.gep(t_row, [builder.add(c0, ir.Constant(intp, width * v))])
                    t = builder.load(builder.bitcast(at, vec.as_pointer()), align=4)
                    builder.store(builder.call(fma_v, [xb, t, builder.load(acc)]), acc)
            for p, acc in zip(o_vecs, accs):
                builder.store(builder.load(acc), p, align=4)
        return context.get_dummy_value()
    return types.none(o, xs, tile, nk), codegen


def _block_swap_masks(b: int) -> tuple[list[int], list[int]]:
    """shufflevector masks that swap the off-diagonal b x b sub-blocks of rows i and i + b (i & b == 0)."""
    lo = [p if not p & b else BLOCK + p - b for p in range(BLOCK)]
    hi = [p + b if not p & b else BLOCK + p for p in range(BLOCK)]
    return lo, hi


@intrinsic
def _transpose_block(typingctx, a, start, s_col, tile, r, c):
    """tile[r + j, c + g] = float32 a[start + g * s_col + j] for j, g < BLOCK: a's rows (contiguous runs of
    BLOCK elements, s_col apart) into tile's columns.

    numba's element-by-element copy down tile columns stays scalar (one conversion and one store per
    element, as much time as the multiply-adds in a decode step): here BLOCK vector loads, widened,
    transposed in registers by 4 rounds of two-source shuffles (each swaps the off-diagonal sub-blocks of
    one size: 1, 2, 4, 8), BLOCK vector stores. A copy: the values, and so the sums, are what they were.
    """
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype in (types.float32, types.uint16)
            and isinstance(tile, types.Array) and tile.ndim == 2 and tile.dtype == types.float32
            and tile.layout == "C" and all(isinstance(v, types.Integer) for v in (start, s_col, r, c))):
        return None
    is_half = a.dtype == types.uint16

    def codegen(context, builder, sig, args):
        f32, i8, i32 = ir.FloatType(), ir.IntType(8), ir.IntType(32)
        vec = ir.VectorType(f32, BLOCK)
        a_elem = ir.HalfType() if is_half else f32
        start_, s_col_, r_, c_ = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (1, 2, 4, 5))
        ap = builder.bitcast(context.make_array(sig.args[0])(context, builder, args[0]).data, a_elem.as_pointer())
        rows = []
        for g in range(BLOCK):
            at = builder.gep(ap, [builder.add(start_, builder.mul(s_col_, ir.Constant(ir.IntType(64), g)))])
            v = builder.load(builder.bitcast(at, ir.VectorType(a_elem, BLOCK).as_pointer()), align=2 if is_half else 4)
            rows.append(builder.fpext(v, vec) if is_half else v)
        b = BLOCK // 2
        while b:                # the rounds commute; the widest first, which LLVM can fold into the loads
            lo, hi = (ir.Constant(ir.VectorType(i32, BLOCK), m) for m in _block_swap_masks(b))
            for i in range(BLOCK):
                if not i & b:
                    u, v = rows[i], rows[i + b]
                    rows[i], rows[i + b] = builder.shuffle_vector(u, v, lo), builder.shuffle_vector(u, v, hi)
            b //= 2
        tile_arr = context.make_array(sig.args[3])(context, builder, args[3])
        row_bytes = builder.extract_value(tile_arr.strides, 0)
        base = builder.bitcast(tile_arr.data, i8.as_pointer())
        for j, v in enumerate(rows):
            at = builder.gep(base, [builder.mul(builder.add(r_, ir.Constant(ir.IntType(64), j)), row_bytes)])
            builder.store(v, builder.bitcast(builder.gep(builder.bitcast(at, f32.as_pointer()), [c_]),
                                             vec.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.none(a, start, s_col, tile, r, c), codegen


@njit(cache=True, fastmath=False, inline="always")
def _fill_tile(a, a_step, ia3, ia2, c0, nc, k0, nk, tile):
    """tile[r, c] = float32 a[ia3, ia2, c0 + c, k0 + r], a given as its memory (1-D) and element steps.

    Where one of a's steps is 1, the copy reads runs of contiguous elements through slices of the 1-D
    array, which LLVM vectorizes (F16 included: vcvtph2ps); numba's strided 4-D indexing stays scalar.
    Where a's rows run along kk (K), whole BLOCK x BLOCK blocks go through _transpose_block instead.
    """
    s3, s2, s_col, s_kk = a_step
    base = ia3 * s3 + ia2 * s2 + c0 * s_col + k0 * s_kk
    if s_kk == 1:                           # rows of a run along kk (K): transposed in blocks, the rest
        nc_b, nk_b = nc // BLOCK * BLOCK, nk // BLOCK * BLOCK      # element by element (a row, a tile column)
        for c in range(0, nc_b, BLOCK):
            for r in range(0, nk_b, BLOCK):
                _transpose_block(a, base + c * s_col + r, s_col, tile, r, c)
        for c in range(nc):
            a_row = a[base + c * s_col:base + c * s_col + nk]
            for r in range(nk_b if c < nc_b else 0, nk):
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
            xs[r] = round_f32_to_f16(as_f32(x_row[r]))
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
    if nc % ROW_BLOCK == 0:
        fma_row(o, xs, tile, nk)
        return
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
def _accumulate_4_rows(o0, o1, o2, o3, x0, x1, x2, x3, tile, nk):
    """_accumulate_row for 4 rows at once (the same operations per element): each tile load feeds 4 FMAs."""
    nc = o0.shape[0]
    r = 0
    while r + 4 <= nk:
        a0, a1, a2, a3 = x0[r], x0[r + 1], x0[r + 2], x0[r + 3]
        b0, b1, b2, b3 = x1[r], x1[r + 1], x1[r + 2], x1[r + 3]
        c0, c1, c2, c3 = x2[r], x2[r + 1], x2[r + 2], x2[r + 3]
        d0, d1, d2, d3 = x3[r], x3[r + 1], x3[r + 2], x3[r + 3]
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
        a0, b0, c0, d0 = x0[r], x1[r], x2[r], x3[r]
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


@njit(cache=True, fastmath=False, inline="always")
def _rows_to_run(row0, row1, n, live, page, skip, rows):
    """rows[:count] = the rows (of row0 .. row1-1) whose token sees the page (every row unless SKIP_COLUMNS)."""
    count = 0
    for row in range(row0, row1):
        if skip != SKIP_COLUMNS or live[row % n, page]:
            rows[count] = row
            count += 1
    return count


@njit(cache=True, fastmath=False, inline="always")
def _sees_all(live, t, k0, nk):
    """Whether token t sees every page of the depth block k0 .. k0+nk-1."""
    for page in range(k0 // PAGE, -(-(k0 + nk) // PAGE)):
        if not live[t, page]:
            return False
    return True


@njit(cache=True, fastmath=False, inline="always")
def _run_task(a, a_shape, a_step, x, out, round_x, live, skip, task):
    """One (a matrix, row block, column group); the rows are those of every b matrix that uses a's matrix.

    For each depth block: the rows' x once (rounded, in xs), then per column block one tile of a, read by
    every row. The loops only decide what runs when: each output still takes its kk in order. ``live`` and
    ``skip``: the pages each token sees and which skip applies (the module docstring).
    """
    n_a3, n_a2, m, k = a_shape
    n_b3, n_b2, n, _ = x.shape
    r3, r2 = n_b3 // n_a3, n_b2 // n_a2
    n_col_groups = -(-m // GROUP_COLS)
    n_row_blocks = -(-(r3 * r2 * n) // ROWS)
    ia, rest = task // (n_col_groups * n_row_blocks), task % (n_col_groups * n_row_blocks)
    cg, rb = rest // n_row_blocks, rest % n_row_blocks
    ia3, ia2 = ia // n_a2, ia % n_a2
    g0, g1 = cg * GROUP_COLS, min(m, (cg + 1) * GROUP_COLS)
    row0, row1 = rb * ROWS, min(r3 * r2 * n, (rb + 1) * ROWS)
    tile = np.empty((DEPTH, COLS), dtype=F32)
    xs = np.empty((row1 - row0, DEPTH), dtype=F32)
    rows = np.empty(row1 - row0, dtype=np.int64)
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
            count = _rows_to_run(row0, row1, n, live, c0 // PAGE, skip, rows)
            if count == 0:
                continue
            _fill_tile(a, a_step, ia3, ia2, c0, c1 - c0, k0, nk, tile)
            if skip == SKIP_DEPTH:   # rows whose token sees only some pages of the block: page by page
                full = 0
                for j in range(count):
                    row = rows[j]
                    i3, i2, t = _b_index(row, ia3, ia2, r3, r2, n)
                    if _sees_all(live, t, k0, nk):
                        rows[full] = row
                        full += 1
                        continue
                    o, x_row = out[i3, i2, t, c0:c1], xs[row - row0]
                    for s0 in range(0, nk, PAGE):
                        if live[t, (k0 + s0) // PAGE]:
                            s1 = min(nk, s0 + PAGE)
                            _accumulate_row(o, x_row[s0:s1], tile[s0:s1], s1 - s0)
                count = full
            j = 0
            while j + 4 <= count:
                i3, i2, t = _b_index(rows[j], ia3, ia2, r3, r2, n)
                j3, j2, u = _b_index(rows[j + 1], ia3, ia2, r3, r2, n)
                l3, l2, v = _b_index(rows[j + 2], ia3, ia2, r3, r2, n)
                h3, h2, w = _b_index(rows[j + 3], ia3, ia2, r3, r2, n)
                _accumulate_4_rows(out[i3, i2, t, c0:c1], out[j3, j2, u, c0:c1], out[l3, l2, v, c0:c1],
                                   out[h3, h2, w, c0:c1], xs[rows[j] - row0], xs[rows[j + 1] - row0],
                                   xs[rows[j + 2] - row0], xs[rows[j + 3] - row0], tile, nk)
                j += 4
            while j < count:
                i3, i2, t = _b_index(rows[j], ia3, ia2, r3, r2, n)
                _accumulate_row(out[i3, i2, t, c0:c1], xs[rows[j] - row0], tile, nk)
                j += 1


@njit(cache=True, nogil=True)
def pages_live(mask, live):
    """live[t, p] = 1 where token t sees a cell of page p (mask (n, n_kv) float32 > -inf there), else 0;
    a token that sees none has every page marked (its row is NaN either way)."""
    n, n_pages = live.shape
    for t in range(n):
        seen = False
        for p in range(n_pages):
            live[t, p] = 0
            for c in range(p * PAGE, min(mask.shape[1], (p + 1) * PAGE)):
                if mask[t, c] != -np.inf:
                    live[t, p] = 1
                    seen = True
                    break
        if not seen:
            live[t, :] = 1


def n_tasks(a_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> int:
    n_a3, n_a2, m, _ = a_shape
    n_b3, n_b2, n, _ = x_shape
    n_rows = (n_b3 // n_a3) * (n_b2 // n_a2) * n
    return n_a3 * n_a2 * -(-m // GROUP_COLS) * -(-n_rows // ROWS)


@njit(cache=True, nogil=True, fastmath=False)
def mul_mat_fixed_order_serial(a, a_shape, a_step, x, out, round_x, live, skip, first, end):
    """Tasks first .. end-1 (of n_tasks(a_shape, x.shape)). a: the memory of a (A3, A2, m, k) operand, 1-D
    float32 or F16 bits (uint16), read at element steps a_step; x (B3, B2, n, k) float32 or F16 bits, any
    strides; out (B3, B2, n, m) float32. B3 and B2 are multiples of A3 and A2 (broadcast, GQA). round_x: round
    x to F16 first (a is F16). live (n, pages) uint8 and skip: the pages each of the n tokens sees, and
    NO_SKIP, SKIP_COLUMNS or SKIP_DEPTH."""
    for task in range(first, end):
        _run_task(a, a_shape, a_step, x, out, round_x, live, skip, task)


@njit(cache=True, nogil=True, fastmath=False, parallel=True)
def mul_mat_fixed_order_parallel(a, a_shape, a_step, x, out, round_x, live, skip, first, end):
    """The serial driver once per task (the index cast to its int64): the task body compiles once, where a
    prange body inlining _run_task compiled it again in numba's parfor passes (2-3x the serial compile)."""
    for i in prange(end - first):
        task = first + np.int64(i)
        mul_mat_fixed_order_serial(a, a_shape, a_step, x, out, round_x, live, skip, task, task + 1)


def as_memory(view: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A 4-D view -> (its memory as a 1-D array from its first element, its steps in elements)."""
    steps = tuple(s // view.itemsize for s in view.strides)
    if any(s < 0 or s * view.itemsize != stride for s, stride in zip(steps, view.strides)):
        view = np.ascontiguousarray(view)                  # negative or odd strides: never from ggml views
        steps = tuple(s // view.itemsize for s in view.strides)
    span = 1 + sum((n - 1) * s for n, s in zip(view.shape, steps)) if view.size else 0
    return np.lib.stride_tricks.as_strided(view, (span,), (view.itemsize,)), steps
