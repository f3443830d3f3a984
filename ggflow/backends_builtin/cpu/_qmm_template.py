"""The one matmul skeleton every quantized weight type runs in, specialised by the type's pieces.

A type brings four pieces (``qmm_pieces.BlockPieces``): ``block_sums`` (the one-pass matvec: int16
sums of products for each group of a block, across the TILE rows of a tile), ``decode`` (a block of
a tile into int16 values, for batches), ``accumulate`` (the group sums into f32 with the block's
scales) and its group count. The skeleton below is written once: tiles of rows, the matvec/batched
switch, the sums of decoded values, the accumulators and the store, and a parallel and a serial
driver around it.

The batched path (more than MATVEC_MAX_TOKENS tokens) decodes each block of a tile once. From
PAIRS_MIN_TOKENS tokens on, it lays the values out as element pairs (``_interleave_pairs``) and forms
the group sums of TOKENS_PER_PASS tokens per pass with int16-pair multiply-accumulates into int32
lanes (``_qmm_pairs.pair_sums``: ``vpdpwssd`` with AVX512-VNNI), two products per lane instead of a
16-bit multiply and add per product (below that, int16 multiplies and adds, a token per pass). The
sums are stored as int16 and ``accumulate`` runs per token exactly as in the matvec path, so every
path gives bit-identical results.

How the pieces reach the skeleton. The drivers take a ``kind`` argument that numba types as a
string literal (``numba.literally``); the stubs ``_block_sums``, ``_decode``, ... are ``@overload``ed
and, at typing time, look the literal up in ``_PIECES`` and inline that type's njit piece. So each
type compiles its own machine code, with the pieces inlined as if written by hand, and numba's
on-disk cache keeps it: the drivers are module-level functions, not closures (factories that close
over njit functions never hit numba's cache, 11 s of recompiling per run). numba only checks this
file's timestamp for its cache, so a kind is ``NAME:STAMP`` with STAMP taken from the files the
pieces come from (``kind_key``): editing a type's pieces changes its key, and so its cache entry.

Calls go to the compiled entry point (``entry_points``), not through the dispatcher: dispatching a
str argument to a literal specialisation re-runs numba's typing on every call (milliseconds).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import warnings
from typing import Callable

import numpy as np
from numba import literally, njit, prange, typeof, types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

from ggflow.backends_builtin.cpu._qmm_int16 import wide_vectors
from ggflow.backends_builtin.cpu._qmm_layout import check_tile
from ggflow.backends_builtin.cpu._qmm_pairs import pair_sums

F32 = np.float32
I16 = np.int16
R = 64     # rows per tile, a compile-time constant of the skeleton (see _qmm_layout.TILE)
check_tile(R, __name__)
TOKENS_PER_PASS = 4     # batched: tokens one pass over a decoded block serves (each weight vector loaded once for them)
MATVEC_MAX_TOKENS = 2   # up to this many tokens the one-pass matvec beats decoding into a buffer
# from this many tokens on, the batched path multiplies in int16 pairs (vpdpwssd); below, the
# interleaving pass (a second buffer, 64 KiB for a K-quant block with the decoded one) costs more
# than it saves: n = 3-4 ran up to 1.4x slower that way, n = 8 about even, n = 64 1.1-1.8x faster
PAIRS_MIN_TOKENS = 8
if PAIRS_MIN_TOKENS < TOKENS_PER_PASS:
    raise ImportError("PAIRS_MIN_TOKENS must be at least TOKENS_PER_PASS (the last pass re-reads the last tokens)")

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


# -- the per-type pieces, resolved at typing time ---------------------------------------------------
def _block_sums(kind, w, t, b, xq, i, o, part):
    raise NotImplementedError("only called from compiled kernels")


def _decode(kind, w, t, b, wd):
    raise NotImplementedError("only called from compiled kernels")


def _accumulate(kind, acc, part, w, t, b, dx, xe, i):
    raise NotImplementedError("only called from compiled kernels")


def _shape(kind):
    raise NotImplementedError("only called from compiled kernels")


@overload(_block_sums, inline="always")
def _ov_block_sums(kind, w, t, b, xq, i, o, part):
    p = _pieces_of(kind)
    if p is None:
        return None
    fn = p.block_sums

    def impl(kind, w, t, b, xq, i, o, part):
        fn(w, t, b, xq, i, o, part)
    return impl


@overload(_decode, inline="always")
def _ov_decode(kind, w, t, b, wd):
    p = _pieces_of(kind)
    if p is None:
        return None
    fn = p.decode

    def impl(kind, w, t, b, wd):
        fn(w, t, b, wd)
    return impl


@overload(_accumulate, inline="always")
def _ov_accumulate(kind, acc, part, w, t, b, dx, xe, i):
    p = _pieces_of(kind)
    if p is None:
        return None
    fn = p.accumulate

    def impl(kind, acc, part, w, t, b, dx, xe, i):
        fn(acc, part, w, t, b, dx, xe, i)
    return impl


@overload(_shape, inline="always")
def _ov_shape(kind):
    p = _pieces_of(kind)
    if p is None:
        return None
    block_size, groups = p.block_size, p.groups

    def impl(kind):
        return block_size, groups
    return impl


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
def _interleave_pairs(wd, wp, qk):
    """wp[j, 2r + h] = wd[2j + h, r]: element pairs of a row side by side, one 32-bit lane per pair."""
    for j in range(qk // 2):
        for r in range(R):
            wp[j, 2 * r] = wd[2 * j, r]
            wp[j, 2 * r + 1] = wd[2 * j + 1, r]


@njit(cache=True, inline="always")
def _sum_pairs(wp, xq, i, ntok, o, qk, gsize, part):
    """part[u, g, :] = the group sums of tokens i .. i + ntok - 1 (ntok a literal), formed in int32
    pairs (vpdpwssd) and stored as int16: exactly the int16 sums of the matvec path (the same value
    mod 2**16, and the pieces' groups fit int16), so ``accumulate`` sees the same numbers."""
    for g in range(qk // gsize):
        pair_sums(wp, xq, i, ntok, o, g * (gsize // 2), gsize // 2, part, g, R)


@njit(cache=True, inline="always")
def _store_tile(acc, out, i, t):
    base = t * R
    for r in range(min(R, out.shape[1] - base)):
        out[i, base + r] = acc[r]


@njit(cache=True, nogil=True)
def _tile(kind, t, w, xq, dx, xe, out):
    wide_vectors()
    qk, groups = _shape(kind)
    nb = w[0].shape[1]
    n = out.shape[0]
    part = np.empty((groups, R), I16)
    acc = np.zeros((n, R), F32)
    if n <= MATVEC_MAX_TOKENS:
        for i in range(n):
            for b in range(nb):
                _block_sums(kind, w, t, b, xq, i, b * qk, part)
                _accumulate(kind, acc[i], part, w, t, b, dx, xe, i)
    elif n < PAIRS_MIN_TOKENS:
        wd = np.empty((qk, R), I16)
        for b in range(nb):
            _decode(kind, w, t, b, wd)
            for i in range(n):
                _sum_decoded(wd, xq, i, b * qk, qk, qk // groups, part)
                _accumulate(kind, acc[i], part, w, t, b, dx, xe, i)
    else:
        wd = np.empty((qk, R), I16)
        wp = np.empty((qk // 2, 2 * R), I16)
        sums = np.empty((TOKENS_PER_PASS, groups, R), I16)
        for b in range(nb):
            _decode(kind, w, t, b, wd)
            _interleave_pairs(wd, wp, qk)
            i = 0
            while i + TOKENS_PER_PASS <= n:
                _sum_pairs(wp, xq, i, TOKENS_PER_PASS, b * qk, qk, qk // groups, sums)
                for u in range(TOKENS_PER_PASS):
                    _accumulate(kind, acc[i + u], sums[u], w, t, b, dx, xe, i + u)
                i += TOKENS_PER_PASS
            if i < n:
                # the last 1-3 tokens: a pass over the last TOKENS_PER_PASS tokens, accumulating only
                # those not done yet (one compiled pass form, not four; a 1-token pass is latency-bound)
                last = n - TOKENS_PER_PASS
                _sum_pairs(wp, xq, last, TOKENS_PER_PASS, b * qk, qk, qk // groups, sums)
                for u in range(i - last, TOKENS_PER_PASS):
                    _accumulate(kind, acc[last + u], sums[u], w, t, b, dx, xe, last + u)
    for i in range(n):
        _store_tile(acc[i], out, i, t)


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


def entry_points(kind: str, w: tuple, xq: np.ndarray, dx: np.ndarray, xe: np.ndarray,
                 out: np.ndarray) -> tuple[Kernel, Kernel]:
    """(parallel, serial) compiled kernels for these argument types, each called as f(kind, w, xq, dx, xe, out)."""
    sig = (types.literal(kind),) + tuple(typeof(a) for a in (w, xq, dx, xe, out))
    with warnings.catch_warnings():
        # numba's pedantic scope check flags the loop variables of pieces inlined three calls deep
        # ("variable ... is not in scope"); the generated code is unaffected (the outputs are
        # bit-identical to the hand-written kernels this skeleton replaced)
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        return _mul_mat_parallel.compile(sig), _mul_mat_serial.compile(sig)
