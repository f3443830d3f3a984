"""Software prefetch of a packed weight's next blocks while the kernel multiplies the current one.

A decode step streams every weight from memory once. The hardware prefetchers follow each packed array's
stream, but on a fast core a matvec asks for the next block sooner than they bring it: the tile layout
reads, per block of a tile, one run of bytes from each of the weight's arrays (quants, scales, ...), and a
prefetcher stops at each 4 KiB page. ``prefetch_slice`` asks for the cache lines of a block further on
(in row-major (tile, block) order, so the blocks after a tile's last are the next tile's first), which
keeps more misses in flight than the prefetchers alone do. Types with small blocks (Q4_0: 1 KiB a tile)
ask for a whole block 8 KiB ahead once per block (``BlockPieces.prefetch_bytes``, in the skeleton); the
K-quants (9-13 KiB a tile) ask for the next block a quarter at a time from inside their block sums: one
burst of 150-200 requests a block stalls the core where quarters keep the stream going.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LINE = 64


@intrinsic
def prefetch_slice(typingctx, w, t, b, ahead_bytes, part, parts):
    """Prefetch (for reading, into every cache level) block b + a of tile t of each array of the tuple w,
    arrays (n_tiles, n_blocks, ...) C-contiguous, where a is the fewest blocks (at least one) whose bytes,
    all arrays together, make ``ahead_bytes``; past an array's end nothing is asked for. Only slice ``part`` of
    ``parts`` of each array's block is asked for: a type with big blocks spreads the requests over its block's
    steps (the line-fill buffers take a few at a time)."""
    if not (isinstance(w, types.BaseTuple) and all(isinstance(a, types.Array) and a.layout == "C" and a.ndim >= 2
                                                   for a in w.types)
            and all(isinstance(a, types.Integer) for a in (t, b, ahead_bytes, part, parts))):
        return None

    def codegen(context, builder, sig, args):
        intp = cgutils.intp_t
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
            ir.VoidType(), [i8p, i32, i32, i32]))
        t_v, b_v, bytes_v, part_v, parts_v = (context.cast(builder, args[k], sig.args[k], types.intp)
                                              for k in (1, 2, 3, 4, 5))
        members = cgutils.unpack_tuple(builder, args[0], len(sig.args[0].types))
        arrays = [(arrty, context.make_array(arrty)(context, builder, arr))
                  for arrty, arr in zip(sig.args[0].types, members)]
        all_blocks = ir.Constant(intp, 0)
        for arrty, a in arrays:
            all_blocks = builder.add(all_blocks, cgutils.unpack_tuple(builder, a.strides, arrty.ndim)[1])
        ahead_v = builder.sdiv(builder.add(bytes_v, builder.sub(all_blocks, ir.Constant(intp, 1))), all_blocks)
        ahead_v = builder.select(builder.icmp_signed("<", ahead_v, ir.Constant(intp, 1)), ir.Constant(intp, 1), ahead_v)
        for arrty, a in arrays:
            shape = cgutils.unpack_tuple(builder, a.shape, arrty.ndim)
            strides = cgutils.unpack_tuple(builder, a.strides, arrty.ndim)
            block_bytes = strides[1]           # C-contiguous: one block of a tile, all its fields
            index = builder.add(builder.add(builder.mul(t_v, shape[1]), b_v), ahead_v)
            slice_bytes = builder.sdiv(builder.add(block_bytes, builder.sub(parts_v, ir.Constant(intp, 1))), parts_v)
            slice_bytes = builder.mul(builder.sdiv(builder.add(slice_bytes, ir.Constant(intp, LINE - 1)),
                                                   ir.Constant(intp, LINE)), ir.Constant(intp, LINE))
            start = builder.add(builder.mul(index, block_bytes), builder.mul(part_v, slice_bytes))
            end = builder.add(start, slice_bytes)
            total = builder.mul(shape[0], strides[0])
            with builder.if_then(builder.icmp_signed("<=", end, total)):
                base = builder.gep(builder.bitcast(a.data, i8p), [start])
                n_lines = builder.sdiv(slice_bytes, ir.Constant(intp, LINE))
                with cgutils.for_range(builder, n_lines) as loop:
                    addr = builder.gep(base, [builder.mul(loop.index, ir.Constant(intp, LINE))])
                    builder.call(fn, [addr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(w, t, b, ahead_bytes, part, parts), codegen
