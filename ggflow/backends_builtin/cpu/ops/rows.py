"""Data movement: get_rows, set_rows, cpy, cont. Vectorized numpy over all rows at once, but for set_rows
from F32 into F32 or F16 (every KV-cache write): one numba call that checks the ids and copies, rounding
to F16 as numpy does (c_arith.f32_bits_to_f16_bits), where numpy took a min, a max and a fancy assignment.

Conversions follow ggml: any type is read through its to_float (get_rows of a quantized embedding), F32 ->
F16 rounds to nearest even, and a quantized destination is written through its from_float. A copy between
tensors of one type moves the stored bytes, so it is exact for every type (nothing is requantized).
Copies go in ggml's element order (ne[0] fastest), so cpy may also reshape: only element counts must match.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu import entry_points
from ggflow.backends_builtin.cpu.ops import row_decoders
from ggflow.backends_builtin.cpu.arrays import TensorArrays, from_f32, is_native_float, store, to_f32
from ggflow.backends_builtin.cpu.c_arith import f32_bits_to_f16_bits
from ggflow.backends_builtin.cpu.ops.file_rows import pread_rows
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError

Kernel = Callable[[], None]
HAVE_PREAD = hasattr(os, "pread")   # POSIX: libc has the pread file_rows calls (not Windows)


@njit(cache=True, nogil=True)
def rows_in_range(ids, n_rows):
    """One pass instead of numpy's min and max: a decode step checks 60 one-element id arrays."""
    for i in ids.flat:
        if i < 0 or i >= n_rows:
            return False
    return True


@njit(cache=True, nogil=True)
def copy_rows_from_f32(dst, src, ids, n_rows):
    """dst row ids[i] = src row i for float32 src (as uint32 bits) into float32 or float16 (uint16) dst,
    rounded to nearest even as numpy's astype; False, nothing written, when an id is out of range."""
    if not rows_in_range(ids, n_rows):
        return False
    for i in range(ids.shape[0]):
        row = dst[ids[i]]
        for j in range(src.shape[1]):
            row[j] = f32_bits_to_f16_bits(src[i, j]) if dst.itemsize == 2 else src[i, j]
    return True


def check_row_ids(ids: np.ndarray, n_rows: int, node: Tensor) -> None:
    if not rows_in_range(ids, n_rows):
        bad = ids[(ids < 0) | (ids >= n_rows)].reshape(-1)[0]
        label = f"{node.op} {node.name!r}" if node.name else node.op
        raise BackendError(f"{label}: row id {int(bad)} is outside 0..{n_rows - 1}")


# -- get_rows ------------------------------------------------------------------------------------
def bind_get_rows(node: Tensor, arrays: TensorArrays) -> Kernel:
    """out[i12, i11, i10] = a[i12, i11, ids[i12, i11, i10]] (numpy axis order), as float32."""
    a, rows = node.src
    a_view = arrays.view(a)                   # (a3, a2, n_rows, ne0 or row bytes)
    ids_view = arrays.view(rows)[0]           # (r2, r1, r0) with r2 = a3 and r1 = a2
    out = arrays.view(node)                   # (r2, r1, r0, ne0)
    if _file_backed_matrix(a, a_view):
        return _bind_get_file_rows(node, a, a_view, ids_view, out)
    batch3 = np.arange(ids_view.shape[0])[:, None, None]
    batch2 = np.arange(ids_view.shape[1])[None, :, None]

    def run() -> None:
        check_row_ids(ids_view, a.ne[1], node)
        store(out, to_f32(a_view[batch3, batch2, ids_view], a.type), node.type)
    return run


def _file_backed_matrix(a: Tensor, a_view: np.ndarray) -> bool:
    """Whether a is a 2-D matrix whose rows can be read from its file with pread (ops/file_rows.py): its buffer
    maps a file it has a descriptor of, and the plan reads it there (not from a copy on this backend)."""
    buffer = a.buffer
    return (HAVE_PREAD and getattr(buffer, "fileno", None) is not None and a.ne[2] == 1 and a.ne[3] == 1
            and a.is_contiguous() and a_view.ctypes.data == buffer.host_array().ctypes.data + a.offset)


def _bind_get_file_rows(node: Tensor, a: Tensor, a_view: np.ndarray, ids_view: np.ndarray,
                        out: np.ndarray) -> Kernel:
    fileno, row_bytes, n_rows = a.buffer.fileno, a.nb[1], a.ne[1]
    raw = np.empty((ids_view.size, row_bytes), np.uint8)
    rows = raw.view(a_view.dtype).reshape(*ids_view.shape, a_view.shape[-1])

    read = entry_points.bind(pread_rows, fileno, a.offset, row_bytes, ids_view, raw)
    in_range = entry_points.bind(rows_in_range, ids_view, n_rows)
    # a legacy quantized row decoded in one numba call (ops/row_decoders.py), else through the type's to_float
    decode = (row_decoders.bind_decoder(a.type, raw, out.reshape(-1, out.shape[-1]))
              if node.type.name == "F32" and out.flags.c_contiguous else None)

    def run() -> None:
        if not in_range():
            check_row_ids(ids_view, n_rows, node)
        failed = read()
        if failed >= 0:
            raise BackendError(f"{node.op} {node.name!r}: could not read row {int(ids_view.reshape(-1)[failed])} "
                               f"of {a.name!r} from its file (was the file truncated or removed?)")
        if decode is not None:
            decode()
        else:
            store(out, to_f32(rows, a.type), node.type)
    return run


# -- set_rows ------------------------------------------------------------------------------------
def bind_set_rows(node: Tensor, arrays: TensorArrays) -> Kernel:
    """dst row ids[i] = src row i, converted to dst's type. node is a view of dst: it writes there."""
    dst, src, rows = node.src
    dst_rows = arrays.view(node)[0, 0]        # (dst rows, ne0 or row bytes)
    src_rows = arrays.view(src)[0, 0]         # (n, ne0)
    ids = arrays.view(rows)[0, 0, 0]          # (n,)
    if src.type.name == "F32" and dst.type.name in ("F16", "F32") and src_rows.strides[-1] == 4:
        # a KV-cache write: one numba call (check and copy), not numpy's min, max and fancy assignment
        src_bits, dst_bits = src_rows.view(np.uint32), dst_rows.view(np.uint16 if dst.type.name == "F16" else np.uint32)
        n_rows = dst.ne[1]
        copy = entry_points.bind(copy_rows_from_f32, dst_bits, src_bits, ids, n_rows)

        def run_f32() -> None:
            if not copy():
                check_row_ids(ids, n_rows, node)
        return run_f32
    direct = is_native_float(src.type) and is_native_float(dst.type)

    def run() -> None:
        check_row_ids(ids, dst.ne[1], node)
        dst_rows[ids] = src_rows if direct else from_f32(to_f32(src_rows, src.type), dst.type)
    return run


# -- cpy, cont -----------------------------------------------------------------------------------
def bind_cpy(node: Tensor, arrays: TensorArrays) -> Kernel:
    a, _ = node.src
    return _bind_copy(a, arrays.view(a), node, arrays.view(node))


def bind_cont(node: Tensor, arrays: TensorArrays) -> Kernel:
    (a,) = node.src
    return _bind_copy(a, arrays.view(a), node, arrays.view(node))


def _bind_copy(a: Tensor, a_view: np.ndarray, dst: Tensor, d_view: np.ndarray) -> Kernel:
    if a.type.name == dst.type.name or (is_native_float(a.type) and is_native_float(dst.type)):
        if a_view.shape == d_view.shape:
            return lambda: np.copyto(d_view, a_view, casting="unsafe")
        if a.type.is_quantized:   # same blocked type: the byte stream is the block stream
            return lambda: np.copyto(d_view, np.ascontiguousarray(a_view).reshape(d_view.shape))
        return lambda: np.copyto(d_view, a_view.reshape(d_view.shape), casting="unsafe")

    logical = dst.ne[::-1]

    def run_converted() -> None:
        store(d_view, to_f32(a_view, a.type).reshape(logical), dst.type)
    return run_converted
