"""Rows of a weight read from its GGUF file with pread, so that reading them maps none of the file's pages.

get_rows of the token embedding reads one row per token. Read through the memory map, each row faults its
page in, and on kernels that keep the page cache in large folios (Linux 6.x) one fault maps the whole folio
around it, up to 2 MiB: 64 random tokens of Qwen2-0.5B's 151,936-row embedding mapped 30 MiB, and a server
that sees every token in time maps all of it, beside the packed copy the output layer reads (tied
embeddings) or in addition to the weights (separate ones). ``pread`` copies the row's bytes from the page
cache instead: a system call per row (~1 us for a 1-2 KiB row, in a loop in numba, not Python), no pages
in the process's RSS.

libc's ``pread`` is called by name from the kernel (an LLVM declaration resolved against the process's
symbols when the kernel is loaded), not through a ctypes pointer, so numba can cache the kernel on disk.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _pread(typingctx, fd, out, nbytes, offset):
    """libc's pread(fd, out's first byte, nbytes, offset): the bytes read, or -1 (errno set)."""
    sig = types.int64(types.int64, out, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        fd_v, out_v, nbytes_v, offset_v = args
        data = context.make_array(signature.args[1])(context, builder, out_v).data
        i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
        fnty = ir.FunctionType(i64, [ir.IntType(32), i8p, i64, i64])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "pread")
        return builder.call(fn, [builder.trunc(fd_v, ir.IntType(32)), builder.bitcast(data, i8p), nbytes_v, offset_v])
    return sig, codegen


@njit(cache=True, nogil=True)
def pread_rows(fd, first_row_offset, row_bytes, ids, out):
    """out[i] = the row_bytes bytes at first_row_offset + ids[i] * row_bytes in the file; returns -1, or the
    index of the first row that could not be read whole (the file shrank, an I/O error)."""
    flat = ids.reshape(-1)
    for i in range(flat.size):
        row = out[i]
        done = 0
        while done < row_bytes:
            got = _pread(fd, row[done:], row_bytes - done, first_row_offset + flat[i] * row_bytes + done)
            if got <= 0:
                return i
            done += got
    return -1
