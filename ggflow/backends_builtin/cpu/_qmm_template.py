"""The one matmul skeleton every quantized weight type runs in, specialised by the type's pieces.

A type brings four pieces (``qmm_pieces.BlockPieces``): ``block_sums`` (the one-pass matvec: int16
sums of products for each group of a block, across the TILE rows of a tile), ``decode`` (a block of
a tile into int16 values, for batches), ``accumulate`` (the group sums into f32 with the block's
scales) and its group count. The skeleton below is written once: tiles of rows, the matvec/batched
switch, the sums of decoded values, the accumulators and the store, and a parallel and a serial
driver around it.

How the pieces reach the skeleton. The drivers take a ``kind`` argument that numba types as a
string literal (``numba.literally``); the tile function ``_tile`` is a stub ``@overload``ed per kind:
at typing time the overload looks the literal up in ``_PIECES`` and returns the skeleton with that
type's njit pieces called in it, which numba inlines (``inline="always"``). So each type compiles its
own machine code, as if its tile function were written by hand, and numba's on-disk cache keeps it:
the drivers are module-level functions, not closures (factories that close over njit functions never
hit numba's cache, 11 s of recompiling per run). numba only checks this file's timestamp for its
cache, so a kind is ``NAME:STAMP`` with STAMP taken from the files the pieces come from (``kind_key``):
editing a type's pieces changes its key, and so its cache entry.

Calls go to the compiled entry point (``entry_point``), not through the dispatcher: dispatching a
str argument to a literal specialisation re-runs numba's typing on every call (milliseconds).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import warnings
from typing import Callable

import numpy as np
from numba import literally, njit, prange, types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

from ggflow.backends_builtin.cpu._qmm_int16 import wide_vectors
from ggflow.backends_builtin.cpu._qmm_layout import check_tile

F32 = np.float32
I16 = np.int16
R = 64     # rows per tile, a compile-time constant of the skeleton (see _qmm_layout.TILE)
check_tile(R, __name__)
MATVEC_MAX_TOKENS = 2   # up to this many tokens the one-pass matvec beats decoding into a buffer

_PIECES: dict[str, object] = {}   # kind -> BlockPieces (qmm_pieces), filled by register_pieces


def kind_key(name: str, pieces) -> str:
    """The literal a type's kernels are specialised on: its name and a stamp of its pieces' sources."""
    files = sorted({inspect.getsourcefile(getattr(f, "py_func", f)) or "" for f in pieces.functions()})
    stamp = hashlib.sha1()
    for path in files:
        st = os.stat(path) if path and os.path.exists(path) else None
        stamp.update(f"{path}:{st.st_mtime_ns if st else 0}:{st.st_size if st else 0};".encode())
    return f"{name}:{stamp.hexdigest()[:12]}"


def register_pieces(name: str, pieces) -> str:
    key = kind_key(name, pieces)
    _PIECES[key] = pieces
    return key


def _pieces_of(kind):
    if not isinstance(kind, types.StringLiteral):
        return None
    return _PIECES[kind.literal_value]


# -- the skeleton -------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _sum_decoded(wd, xq, i, o, qk, gsize, part):
    """part[g, :] = sum over elements g*gsize .. (g+1)*gsize-1 of wd * x, two groups per row pass."""
    for g in range(0, qk // gsize, 2):
        for r in range(R):
            a = I16(0)
            c = I16(0)
            for j in range(gsize):
                a = I16(a + wd[gsize * g + j, r] * xq[i, o + gsize * g + j])
                c = I16(c + wd[gsize * g + gsize + j, r] * xq[i, o + gsize * g + gsize + j])
            part[g, r] = a
            part[g + 1, r] = c


@njit(cache=True, inline="always")
def _store_tile(acc, out, i, t):
    base = t * R
    for r in range(min(R, out.shape[1] - base)):
        out[i, base + r] = acc[r]


def _tile(kind, t, w, xq, dx, xe, out):
    """Row tile t of out = W x for the type ``kind`` names (compiled per type, see _ov_tile)."""
    raise NotImplementedError("only called from compiled kernels")


@overload(_tile, jit_options={"nogil": True})
def _ov_tile(kind, t, w, xq, dx, xe, out):
    """The skeleton, written once; numba compiles it per type with that type's pieces inlined.

    The pieces are plain njit functions with inline="always", called directly here: numba inlines them
    into this body as it would a hand-written tile function's helpers. (Inlining them through
    ``@overload(inline="always")`` stubs instead tripled numba's inlining work: Q6_K compiled in 24-34 s
    instead of 7; not inlining them at all made matvecs 6-30x slower, LLVM vectorizing them alone.)"""
    p = _pieces_of(kind)
    if p is None:
        return None
    block_sums, decode, accumulate = p.block_sums, p.decode, p.accumulate
    qk, groups = p.block_size, p.groups
    gsize = qk // groups

    def impl(kind, t, w, xq, dx, xe, out):
        wide_vectors()
        nb = w[0].shape[1]
        n = out.shape[0]
        part = np.empty((groups, R), I16)
        acc = np.zeros((n, R), F32)
        if n <= MATVEC_MAX_TOKENS:
            for i in range(n):
                for b in range(nb):
                    block_sums(w, t, b, xq, i, b * qk, part)
                    accumulate(acc[i], part, w, t, b, dx, xe, i)
        else:
            wd = np.empty((qk, R), I16)
            for b in range(nb):
                decode(w, t, b, wd)
                for i in range(n):
                    _sum_decoded(wd, xq, i, b * qk, qk, gsize, part)
                    accumulate(acc[i], part, w, t, b, dx, xe, i)
        for i in range(n):
            _store_tile(acc[i], out, i, t)
    return impl


@njit(cache=True, parallel=True, nogil=True)
def _mul_mat_parallel(kind, w, xq, dx, xe, out):
    literally(kind)
    for t in prange(w[0].shape[0]):     # the body is one call: numba's parfor passes over big bodies cost compile time
        _tile(kind, t, w, xq, dx, xe, out)


@njit(cache=True, nogil=True)
def _mul_mat_serial(kind, w, xq, dx, xe, out):
    literally(kind)
    for t in range(w[0].shape[0]):
        _tile(kind, t, w, xq, dx, xe, out)


Kernel = Callable[..., None]


def entry_point(kind: str, parallel: bool, arg_types: tuple) -> Kernel:
    """The compiled parallel or serial kernel, called as f(kind, w, xq, dx, xe, out); arg_types: the
    numba types of (w, xq, dx, xe, out).

    Compiled (or loaded from numba's cache) on first use: a model whose products are all small never
    pays for its parallel drivers, which cost the most to compile."""
    sig = (types.literal(kind),) + tuple(arg_types)
    with warnings.catch_warnings():
        # numba's pedantic scope check flags the loop variables of pieces inlined three calls deep
        # ("variable ... is not in scope"); the generated code is unaffected (the outputs are
        # bit-identical to the hand-written kernels this skeleton replaced)
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        return (_mul_mat_parallel if parallel else _mul_mat_serial).compile(sig)
