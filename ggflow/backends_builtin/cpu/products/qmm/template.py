"""The one matmul skeleton every quantized weight type runs in, specialised by the type's pieces.

A type brings four pieces (``cpu_pieces.BlockPieces``): ``block_sums`` (the one-pass matvec: int16
sums of products for each group of a block, across the TILE rows of a tile), ``decode`` (a block of
a tile into int16 values, for batches), ``accumulate`` (the group sums into f32 with the block's
scales) and its group count. The skeleton below is written once: tiles of rows, the matvec/batched
switch, the sums of decoded values, the accumulators and the store, and a parallel and a serial
driver around it. Batches of MATVEC_MAX_TOKENS + 1 tokens or more decode each block once and form the
group sums of TOKENS_PER_PASS tokens per pass with ``qmm.token_sums.token_sums`` (each decoded weight
vector loaded once for the tokens, the sums in registers) where a group has TOKEN_SUMS_MIN_GROUP elements or
more, one token at a time (``_sum_decoded``) where fewer.

Batches of PAIRS_MIN_TOKENS tokens or more run a second tile function, ``_tile_pairs``: each decoded
block laid out as element pairs (``_interleave_pairs``), the group sums of TOKENS_PER_PASS tokens per
pass formed with int16-pair multiply-accumulates into int32 lanes (``qmm.pairs.pair_sums``:
``vpdpwssd`` with AVX512-VNNI), two products per lane instead of a 16-bit multiply and add per product.
The sums are stored as int16 and ``accumulate`` runs per token exactly as in ``_tile``, so every path
gives bit-identical results. Only where the target has AVX-512: on AVX2 it loses to ``_tile``.

Types that bring ``decode_quads`` run products of ``quads_from`` tokens or more in a third tile function,
``_tile_quads``: each block decoded straight into byte quads (four elements of a row per int32 lane), the
group sums of QUAD_TOKENS tokens per pass formed as int32 with byte dot products (``qmm.quads.quad_sums``:
``vpmaddubsw`` on AVX2, ``vpdpbusd`` with AVX512-VNNI), a type's quad_bias taken out through the
activations' group sums; ``accumulate`` reads the same integers, so the same bits again. A type that also
brings ``block_quads`` (the 4- to 8-bit types whose quant bytes are packed as 32-bit words) forms those sums
straight from its packed words for products of up to BLOCK_QUADS_MAX_TOKENS tokens, decode and
one-token matvec alike (``qmm.quads.word_quad_sums``: the nibbles masked in registers, no decoded block
stored and loaded again): in cache 1.1-2x faster than the int16 matvec, and 1.3-3x the decode-then-sum
path at 2-4 tokens, 1.2-1.9x at 64 for the 4-bit types (docs/performance.md, "Eleventh session").

How the pieces reach the skeleton. The drivers take a ``kind`` argument that numba types as a
string literal (``numba.literally``); the tile function ``_tile`` is a stub ``@overload``ed per kind:
at typing time the overload looks the literal up in ``_PIECES`` and returns the skeleton with that
type's njit pieces called in it, which numba inlines (``inline="always"``). So each type compiles its
own machine code, as if its tile function were written by hand, and numba's on-disk cache keeps it:
the drivers are module-level functions, not closures (factories that close over njit functions never
hit numba's cache, 11 s of recompiling per run). numba only checks this file's timestamp for its
cache, so a kind is ``NAME:STAMP`` with STAMP taken from the files the pieces come from and the modules
whose helpers the skeleton compiles in (``kind_key``, ``_SKELETON_FILES``): editing either changes the key,
and so the cache entry.

Calls go to the compiled entry point (``entry_point``), not through the dispatcher: dispatching a
str argument to a literal specialisation re-runs numba's typing on every call (milliseconds).

Compile time. Each path's tile loop is one njit function over a range of tiles (``_mul_mat_tiles`` and its
pairs and quads siblings): the serial driver calls it once, the parallel driver's prange once per thread
(``_thread_share``: a run of whole tiles each), with the bounds cast to the serial call's int64. So the tile
body compiles once and each driver only re-optimises it where numba links it in. A prange body calling the tile
function itself compiled that body again under the parfor passes (and prange's unsigned index made a second
signature): the parallel drivers took 2-3x the serial ones' compile (docs/performance.md, "Compile time of the
parallel drivers").

The tile functions take their range of tiles themselves and allocate their scratch arrays (accumulators, sums,
decoded blocks) once a call, and the parallel drivers call them once a thread, not once a tile: each
allocation, and each array handed to a function numba does not inline, costs a reference count changed with a
lock-prefixed instruction, which waits for the loads in flight. Per tile that cost a one-token product from
memory 5% on one thread, 7-9% in cache (docs/performance.md, "Fifteenth session").
"""
from __future__ import annotations

import hashlib
import inspect
import os
import warnings
from typing import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import literally, njit, prange, types
from numba.core import cgutils
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import intrinsic, overload

from ggflow.backends_builtin.cpu.products.qmm import amx as _qmm_amx
from ggflow.backends_builtin.cpu.products.qmm import floats as _qmm_float
from ggflow.backends_builtin.cpu.products.qmm import int16 as _qmm_int16
from ggflow.backends_builtin.cpu.products.qmm import layout as _qmm_layout
from ggflow.backends_builtin.cpu.products.qmm import pairs as _qmm_pairs
from ggflow.backends_builtin.cpu.products.qmm import prefetch as _qmm_prefetch
from ggflow.backends_builtin.cpu.products.qmm import quads as _qmm_quads
from ggflow.backends_builtin.cpu.products.qmm import token_sums as _qmm_token_sums
from ggflow.backends_builtin.cpu.products.qmm.int16 import wide_vectors
from ggflow.backends_builtin.cpu.products.qmm.layout import check_tile
from ggflow.backends_builtin.cpu.products.qmm.pairs import pair_sums, pairs_are_fast
from ggflow.backends_builtin.cpu.products.qmm.prefetch import prefetch_slice
from ggflow.backends_builtin.cpu.products.qmm.quads import quad_sums, quads_add_in_int32, quads_are_exact
from ggflow.backends_builtin.cpu.products.qmm.token_sums import token_sums

F32 = np.float32
I16 = np.int16
I32 = np.int32
R = 64     # rows per tile, a compile-time constant of the skeleton (see qmm.layout.TILE)
check_tile(R, __name__)
MATVEC_MAX_TOKENS = 2   # up to this many tokens the one-pass matvec beats decoding into a buffer
TOKENS_PER_PASS = 4     # pairs path: tokens one pass over a decoded block serves (each weight vector loaded once)
# From this many tokens on, batches take the pairs kernel (int16 pairs multiplied into int32 lanes,
# vpdpwssd); below, the interleaving pass costs more than it saves (n = 3-4 ran up to 1.4x slower that
# way, n = 8 about even, n = 64 1.1-1.8x faster). It is a kernel of its own, compiled on first use:
# decoding and short prompts never pay its compile time.
PAIRS_MIN_TOKENS = 8
# token_sums pays from groups of this many elements; with fewer (Q8_0's pairs: 16 groups of 2) zeroing and
# storing the accumulators per group costs more than it saves (Q8_0 49152 x 576, 4 tokens: 4.5-5.3 ms the
# scalar way, 5.9-6.8 ms in registers; Q4_1's 16-element groups: 1.2-1.5x faster in registers).
TOKEN_SUMS_MIN_GROUP = 8
# The quads kernel (byte quads, vpmaddubsw / vpdpbusd; see qmm.quads) takes QUAD_TOKENS tokens per pass over
# a decoded block: two kept AVX2's 16 vector registers free of spills (Q4_1 1536 x 576 on a Zen 3, n = 4: four
# per pass 1.3-1.6x slower than two). From how many tokens a type takes it is the type's (BlockPieces.quads_from).
QUAD_TOKENS = 2
# Types that bring block_quads (the quads' sums straight from the packed words) take it in the quads kernel for
# products of up to this many tokens, a prompt's 64 included; past it a block decoded once (decode_quads) serves
# the tokens. Splitting the words again in registers for every pass still beat loading the decoded quads, whose
# bytes are twice the nibbles': 2048 x 2048, 64 tokens, one thread, Q4_K 1556-1872 -> 966-1000 us, Q4_1 1536 x
# 576 409-415 -> 330-357, Q4_0 1796-2080 -> 1307-1479, Q5_K 1502-1947 -> 1405-1410; Q6_K and Q5_0 about even.
BLOCK_QUADS_MAX_TOKENS = 64
# From this many tokens on, where the CPU has AMX (qmm.amx.amx_available), a type with decode_quads and at most
# AMX_MAX_GROUPS quad groups a block takes the tiles: a block decoded once, then each group's sums of 16 tokens x
# 64 rows in four tdpbsud. A block's sums of 16 tokens are 16 x groups x 64 int32, written by the tiles and read by
# the accumulate: 32 KiB at 8 groups, in L1; at Q2_K's, Q3_K's and Q6_K's 16 they spill, and those ran 0.3-0.6x the
# quads path. 64 tokens, 2048 x 2048, one thread, against the quads path: Q4_0 1.33-1.42x, Q4_1 (576 x 576)
# 1.26-1.30x, Q5_0 1.57x, Q5_1 1.46x, Q8_0 1.28-1.35x, Q4_K 1.07-1.22x, Q5_K 1.69x.
AMX_MIN_TOKENS = 16
AMX_MAX_GROUPS = 8
if PAIRS_MIN_TOKENS < TOKENS_PER_PASS:
    raise ImportError("PAIRS_MIN_TOKENS must be at least TOKENS_PER_PASS (the last pass re-reads the last tokens)")

_PIECES: dict[str, object] = {}   # kind -> BlockPieces (cpu_pieces), filled by register_pieces


# The modules whose njit functions and intrinsics the skeleton compiles into every type's kernels: numba's cache
# checks none of them (only this file), so the kind key stamps them with the pieces' own sources.
_SKELETON_FILES = tuple(inspect.getsourcefile(m) or "" for m in (
    _qmm_amx, _qmm_float, _qmm_int16, _qmm_layout, _qmm_pairs, _qmm_prefetch, _qmm_quads, _qmm_token_sums))


def kind_key(name: str, pieces) -> str:
    """The literal a type's kernels are specialised on: its name and a stamp of its pieces' sources and of the
    modules the skeleton compiles in with them (_SKELETON_FILES)."""
    files = sorted({inspect.getsourcefile(getattr(f, "py_func", f)) or "" for f in pieces.functions()}
                   | set(_SKELETON_FILES))
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
def _passes(n):
    """Passes of TOKENS_PER_PASS tokens that cover n >= TOKENS_PER_PASS tokens."""
    return -(-n // TOKENS_PER_PASS)


@njit(cache=True, inline="always")
def _pass(p, n):
    """(first token of pass p, first of its tokens to accumulate): whole passes, then for the last 1-3
    tokens one more pass over the last TOKENS_PER_PASS tokens that accumulates only those not done yet
    (one compiled pass form, not four)."""
    i = min(TOKENS_PER_PASS * p, n - TOKENS_PER_PASS)
    return i, TOKENS_PER_PASS * p - i


@njit(cache=True, inline="always")
def _store_tile(acc, out, i, t):
    base = t * R
    for r in range(min(R, out.shape[1] - base)):
        out[i, base + r] = acc[r]


def _tile(kind, t0, t1, w, xq, dx, xe, out):
    """Row tiles t0 .. t1-1 of out = W x for the type ``kind`` names (compiled per type, see _ov_tile)."""
    raise NotImplementedError("only called from compiled kernels")


@overload(_tile, jit_options={"nogil": True})
def _ov_tile(kind, t0, t1, w, xq, dx, xe, out):
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
    in_registers = gsize >= TOKEN_SUMS_MIN_GROUP   # a constant: LLVM drops the other branch
    ahead = p.prefetch_bytes                       # also a constant: 0 drops the prefetch

    def impl(kind, t0, t1, w, xq, dx, xe, out):
        wide_vectors()
        nb = w[0].shape[1]
        n = out.shape[0]
        part = np.empty((groups, R), I16)
        acc = np.empty((n, R), F32)
        wd = np.empty((qk, R), I16)
        sums = np.empty((TOKENS_PER_PASS, groups, R), I16)
        for t in range(t0, t1):
            acc[:] = 0
            if n <= MATVEC_MAX_TOKENS:
                for i in range(n):
                    for b in range(nb):
                        if ahead and i == 0:
                            prefetch_slice(w, t, b, ahead, 0, 1)
                        block_sums(w, t, b, xq, i, b * qk, part)
                        accumulate(acc[i], part, w, t, b, dx, xe, i)
            elif not in_registers:
                # a block decoded once, then multiplied into one token after the other
                for b in range(nb):
                    decode(w, t, b, wd)
                    for i in range(n):
                        _sum_decoded(wd, xq, i, b * qk, qk, gsize, part)
                        accumulate(acc[i], part, w, t, b, dx, xe, i)
            else:
                # a block decoded once, then the group sums of TOKENS_PER_PASS tokens per pass (_pass);
                # fewer tokens than that: one token per pass
                for b in range(nb):
                    decode(w, t, b, wd)
                    if n < TOKENS_PER_PASS:
                        for i in range(n):
                            token_sums(wd, xq, i, 1, b * qk, qk, gsize, sums, R)
                            accumulate(acc[i], sums[0], w, t, b, dx, xe, i)
                        continue
                    for p in range(_passes(n)):
                        i, first = _pass(p, n)
                        token_sums(wd, xq, i, TOKENS_PER_PASS, b * qk, qk, gsize, sums, R)
                        for u in range(first, TOKENS_PER_PASS):
                            accumulate(acc[i + u], sums[u], w, t, b, dx, xe, i + u)
            for i in range(n):
                _store_tile(acc[i], out, i, t)
    return impl


@intrinsic
def _threads_now(typingctx):
    """numba's thread count now (``numba.get_num_threads()``), called by the symbol numba's own parallel loops
    call: ``numba.get_num_threads()`` compiled in holds a pointer, which numba's cache refuses to keep."""
    numba.get_num_threads()             # starts numba's threading layer, which registers the symbol

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads")
        return builder.call(fn, [])
    return types.intp(), codegen


@njit(cache=True, inline="always")
def _thread_share(c, chunks, n_tiles):
    """(first tile, last + 1) of share c of chunks: whole tiles, as even as they come, in order."""
    c = np.int64(c)
    return c * n_tiles // chunks, (c + 1) * n_tiles // chunks


@njit(cache=True, nogil=True)
def _mul_mat_tiles(kind, w, xq, dx, xe, out, t0, t1):
    """Row tiles t0 .. t1-1: the body both drivers call (the module docstring, "Compile time")."""
    literally(kind)
    _tile(kind, t0, t1, w, xq, dx, xe, out)


@njit(cache=True, parallel=True, nogil=True)
def _mul_mat_parallel(kind, w, xq, dx, xe, out):
    literally(kind)
    n_tiles = w[0].shape[0]
    chunks = min(n_tiles, _threads_now())
    for c in prange(chunks):
        t0, t1 = _thread_share(c, chunks, n_tiles)
        _mul_mat_tiles(kind, w, xq, dx, xe, out, t0, t1)


@njit(cache=True, nogil=True)
def _mul_mat_serial(kind, w, xq, dx, xe, out):
    literally(kind)
    _mul_mat_tiles(kind, w, xq, dx, xe, out, np.int64(0), w[0].shape[0])


def _tile_pairs(kind, t0, t1, w, xq, dx, xe, out):
    """Row tiles t0 .. t1-1 of out = W x for PAIRS_MIN_TOKENS tokens or more (compiled per type, see
    _ov_tile_pairs)."""
    raise NotImplementedError("only called from compiled kernels")


@overload(_tile_pairs, jit_options={"nogil": True})
def _ov_tile_pairs(kind, t0, t1, w, xq, dx, xe, out):
    """The batched path in int16 pairs: a block decoded once, laid out as element pairs, then group sums
    of TOKENS_PER_PASS tokens per pass (``qmm.pairs.pair_sums``), accumulated per token in order as in
    ``_tile``: the same bits."""
    p = _pieces_of(kind)
    if p is None:
        return None
    decode, accumulate = p.decode, p.accumulate
    qk, groups = p.block_size, p.groups
    gsize = qk // groups

    def impl(kind, t0, t1, w, xq, dx, xe, out):
        wide_vectors()
        nb = w[0].shape[1]
        n = out.shape[0]
        acc = np.empty((n, R), F32)
        wd = np.empty((qk, R), I16)
        wp = np.empty((qk // 2, 2 * R), I16)
        sums = np.empty((TOKENS_PER_PASS, groups, R), I16)
        for t in range(t0, t1):
            acc[:] = 0
            for b in range(nb):
                decode(w, t, b, wd)
                _interleave_pairs(wd, wp, qk)
                for p in range(_passes(n)):
                    i, first = _pass(p, n)
                    _sum_pairs(wp, xq, i, TOKENS_PER_PASS, b * qk, qk, gsize, sums)
                    for u in range(first, TOKENS_PER_PASS):
                        accumulate(acc[i + u], sums[u], w, t, b, dx, xe, i + u)
            for i in range(n):
                _store_tile(acc[i], out, i, t)
    return impl


@njit(cache=True, nogil=True)
def _mul_mat_pairs_tiles(kind, w, xq, dx, xe, out, t0, t1):
    literally(kind)
    _tile_pairs(kind, t0, t1, w, xq, dx, xe, out)


@njit(cache=True, parallel=True, nogil=True)
def _mul_mat_pairs_parallel(kind, w, xq, dx, xe, out):
    literally(kind)
    n_tiles = w[0].shape[0]
    chunks = min(n_tiles, _threads_now())
    for c in prange(chunks):
        t0, t1 = _thread_share(c, chunks, n_tiles)
        _mul_mat_pairs_tiles(kind, w, xq, dx, xe, out, t0, t1)


@njit(cache=True, nogil=True)
def _mul_mat_pairs_serial(kind, w, xq, dx, xe, out):
    literally(kind)
    _mul_mat_pairs_tiles(kind, w, xq, dx, xe, out, np.int64(0), w[0].shape[0])


def _tile_quads(kind, t0, t1, w, x8, xs, dx, xe, out):
    """Row tiles t0 .. t1-1 of out = W x for a type with decode_quads (compiled per type, see _ov_tile_quads)."""
    raise NotImplementedError("only called from compiled kernels")


@overload(_tile_quads, jit_options={"nogil": True})
def _ov_tile_quads(kind, t0, t1, w, x8, xs, dx, xe, out):
    """The batched path in byte quads: a block decoded once by the type's ``decode_quads`` (four elements
    of a row per int32 lane, unsigned bytes), the group sums of QUAD_TOKENS tokens per pass formed in int32
    (``qmm.quads.quad_sums``: vpmaddubsw, vpdpbusd), accumulated per token in order as in ``_tile``: the
    same integers, so the same bits. A type whose quads carry a bias gets it taken out through xs, its
    activations' group sums (``_activation_group_sums``)."""
    p = _pieces_of(kind)
    if p is None or p.decode_quads is None:
        return None
    decode_quads, bias = p.decode_quads, p.quad_bias
    qk = p.block_size
    qgroups, accumulate, groups = quad_plan(p, quads_add_in_int32())
    block_accumulate = block_quads_accumulate(p, quads_add_in_int32())
    quads_per_group = qk // qgroups // 4
    ahead = p.prefetch_bytes
    # a type without block_quads never takes that loop (direct_max 0); the stub only keeps it typed
    block_quads = p.block_quads or _no_block_quads
    direct_max = BLOCK_QUADS_MAX_TOKENS if p.block_quads is not None else 0

    def impl(kind, t0, t1, w, x8, xs, dx, xe, out):
        wide_vectors()
        nb = w[0].shape[1]
        n = out.shape[0]
        acc = np.empty((n, R), F32)
        sums = np.zeros((QUAD_TOKENS, groups, R), I32)   # groups past qgroups stay 0: accumulate adds them
        wq = np.empty((qk // 4, R), I32)
        for t in range(t0, t1):
            acc[:] = 0
            if n <= direct_max:
                for b in range(nb):
                    if ahead:
                        prefetch_slice(w, t, b, ahead, 0, 1)
                    for i in range(0, n - n % QUAD_TOKENS, QUAD_TOKENS):
                        block_quads(w, t, b, x8, xs, i, QUAD_TOKENS, b * qk, sums)
                        for u in range(QUAD_TOKENS):
                            block_accumulate(acc[i + u], sums[u], w, t, b, dx, xe, i + u)
                    for i in range(n - n % QUAD_TOKENS, n):
                        block_quads(w, t, b, x8, xs, i, 1, b * qk, sums)
                        block_accumulate(acc[i], sums[0], w, t, b, dx, xe, i)
            else:
                for b in range(nb):
                    if ahead:
                        prefetch_slice(w, t, b, ahead, 0, 1)
                    decode_quads(w, t, b, wq)
                    for i in range(0, n - n % QUAD_TOKENS, QUAD_TOKENS):
                        for g in range(qgroups):
                            quad_sums(wq, x8, i, QUAD_TOKENS, b * qk, g * quads_per_group, quads_per_group, sums, g,
                                      R, xs, b * qgroups + g, bias)
                        for u in range(QUAD_TOKENS):
                            accumulate(acc[i + u], sums[u], w, t, b, dx, xe, i + u)
                    for i in range(n - n % QUAD_TOKENS, n):
                        for g in range(qgroups):
                            quad_sums(wq, x8, i, 1, b * qk, g * quads_per_group, quads_per_group, sums, g, R,
                                      xs, b * qgroups + g, bias)
                        accumulate(acc[i], sums[0], w, t, b, dx, xe, i)
            for i in range(n):
                _store_tile(acc[i], out, i, t)
    return impl


@njit(cache=True, inline="always")
def _no_block_quads(w, t, b, x8, xs, i, ntok, o, part):
    """Stands in for block_quads where a type has none (never called: see _ov_tile_quads)."""


def quad_plan(p, int32_sums: bool) -> tuple:
    """(groups the quads sum apart, the accumulate that reads the sums, groups of sums it reads: past the first
    the zeros) for the pieces p, on a target whose quads add in int32 (``int32_sums``) or not."""
    if p.quad_groups_int32 and not int32_sums:
        return p.groups, p.accumulate, p.groups
    if p.accumulate_quads is None:
        return p.quad_group_count, p.accumulate, p.groups
    return p.quad_group_count, p.accumulate_quads, p.quad_group_count


def block_quads_accumulate(p, int32_sums: bool):
    """The accumulate that reads block_quads' sums: the type's accumulate_block_quads (its block_quads folded the
    scales in), except where quad_groups_int32 sends the quads back to the type's groups (AVX2), else quad_plan's."""
    if p.accumulate_block_quads is not None and (int32_sums or not p.quad_groups_int32):
        return p.accumulate_block_quads
    return quad_plan(p, int32_sums)[1]


def _activation_group_sums(kind, x8):
    """(n, groups of the row) int32 sums of each group's activations where the type's quads carry a bias
    (compiled per type); a (1, 1) placeholder where they don't."""
    raise NotImplementedError("only called from compiled kernels")


@overload(_activation_group_sums, jit_options={"nogil": True})
def _ov_activation_group_sums(kind, x8):
    p = _pieces_of(kind)
    if p is None:
        return None
    gsize = p.block_size // quad_plan(p, quads_add_in_int32())[0]

    if not p.quad_bias:
        return lambda kind, x8: np.zeros((1, 1), I32)

    def impl(kind, x8):
        n, k = x8.shape
        xs = np.empty((n, k // gsize), I32)
        for i in range(n):
            for c in range(k // gsize):
                s = I32(0)
                for e in range(gsize):
                    s += I32(x8[i, c * gsize + e])
                xs[i, c] = s
        return xs
    return impl


@njit(cache=True, nogil=True)
def _mul_mat_quads_tiles(kind, w, x8, xs, dx, xe, out, t0, t1):
    literally(kind)
    _tile_quads(kind, t0, t1, w, x8, xs, dx, xe, out)


@njit(cache=True, parallel=True, nogil=True)
def _mul_mat_quads_parallel(kind, w, xq, dx, xe, out):
    literally(kind)
    x8 = xq.astype(np.int8)     # quantized activations fit a byte: the quads read four at a time
    xs = _activation_group_sums(kind, x8)
    n_tiles = w[0].shape[0]
    chunks = min(n_tiles, _threads_now())
    for c in prange(chunks):
        t0, t1 = _thread_share(c, chunks, n_tiles)
        _mul_mat_quads_tiles(kind, w, x8, xs, dx, xe, out, t0, t1)


@njit(cache=True, nogil=True)
def _mul_mat_quads_serial(kind, w, xq, dx, xe, out):
    literally(kind)
    x8 = xq.astype(np.int8)
    xs = _activation_group_sums(kind, x8)
    _mul_mat_quads_tiles(kind, w, x8, xs, dx, xe, out, np.int64(0), w[0].shape[0])


def _tile_amx(kind, t0, t1, w, x8, xs, dx, xe, out):
    """Row tiles t0 .. t1-1 of out = W x on AMX tiles (compiled per type, see _ov_tile_amx)."""
    raise NotImplementedError("only called from compiled kernels")


@overload(_tile_amx, jit_options={"nogil": True})
def _ov_tile_amx(kind, t0, t1, w, x8, xs, dx, xe, out):
    """The quads path with the group sums of qmm.amx.TOKENS tokens per pass formed on AMX tiles
    (``qmm.amx.group_sums``): a block decoded once by ``decode_quads``, then per group one tile of the tokens'
    activations against the block's quads, the bias taken out through xs, accumulated per token in order as in
    ``_tile``: the same integers, so the same bits. x8 and xs have rows for whole passes (the driver pads them)."""
    p = _pieces_of(kind)
    if p is None or p.decode_quads is None:
        return None
    decode_quads, bias = p.decode_quads, p.quad_bias
    qk = p.block_size
    qgroups, accumulate, groups = quad_plan(p, True)    # AMX's CPUs have VNNI: the quads add in int32
    quads_per_group = qk // qgroups // 4
    ahead = p.prefetch_bytes
    tokens = _qmm_amx.TOKENS

    def impl(kind, t0, t1, w, x8, xs, dx, xe, out):
        wide_vectors()
        nb = w[0].shape[1]
        n = out.shape[0]
        acc = np.empty((n, R), F32)
        sums = np.zeros((tokens, groups, R), I32)     # groups past qgroups stay 0: accumulate adds them
        wq = np.empty((qk // 4, R), I32)
        _qmm_amx.tiles_start(_qmm_amx.tile_config(4 * quads_per_group))
        for t in range(t0, t1):
            acc[:] = 0
            for b in range(nb):
                if ahead:
                    prefetch_slice(w, t, b, ahead, 0, 1)
                decode_quads(w, t, b, wq)
                for i in range(0, n, tokens):
                    for g in range(qgroups):
                        _qmm_amx.group_sums(wq, x8, i, b * qk, g * quads_per_group, sums, g)
                        if bias:
                            for u in range(tokens):
                                correction = I32(bias) * xs[i + u, b * qgroups + g]
                                for r in range(R):
                                    sums[u, g, r] -= correction
                    for u in range(min(tokens, n - i)):
                        accumulate(acc[i + u], sums[u], w, t, b, dx, xe, i + u)
            for i in range(n):
                _store_tile(acc[i], out, i, t)
        _qmm_amx.tiles_end()
    return impl


@njit(cache=True, nogil=True)
def _mul_mat_amx_tiles(kind, w, x8, xs, dx, xe, out, t0, t1):
    literally(kind)
    _tile_amx(kind, t0, t1, w, x8, xs, dx, xe, out)


@njit(cache=True, inline="always")
def _amx_activations(kind, xq):
    """The activations as bytes in whole passes of qmm.amx.TOKENS rows (the rows past n zero), and their group
    sums where the type's quads carry a bias."""
    n, k = xq.shape
    x8 = np.zeros((-(-n // _qmm_amx.TOKENS) * _qmm_amx.TOKENS, k), np.int8)
    for i in range(n):
        for j in range(k):
            x8[i, j] = xq[i, j]       # quantized activations fit a byte
    return x8, _activation_group_sums(kind, x8)


@njit(cache=True, parallel=True, nogil=True)
def _mul_mat_amx_parallel(kind, w, xq, dx, xe, out):
    literally(kind)
    x8, xs = _amx_activations(kind, xq)
    n_tiles = w[0].shape[0]
    chunks = min(n_tiles, _threads_now())
    for c in prange(chunks):
        t0, t1 = _thread_share(c, chunks, n_tiles)
        _mul_mat_amx_tiles(kind, w, x8, xs, dx, xe, out, t0, t1)


@njit(cache=True, nogil=True)
def _mul_mat_amx_serial(kind, w, xq, dx, xe, out):
    literally(kind)
    x8, xs = _amx_activations(kind, xq)
    _mul_mat_amx_tiles(kind, w, x8, xs, dx, xe, out, np.int64(0), w[0].shape[0])


Kernel = Callable[..., None]


def amx_takes(pieces) -> bool:
    """Whether the pieces' type takes the AMX path where the CPU has AMX (AMX_MAX_GROUPS)."""
    return pieces.decode_quads is not None and quad_plan(pieces, True)[2] <= AMX_MAX_GROUPS


def batch_path(kind: str, n_tokens: int) -> str:
    """Which kernel a product of n_tokens of the type ``kind`` names (register_pieces) runs, all giving the
    same bits: "amx" from AMX_MIN_TOKENS where the CPU has AMX and the type has few enough quad groups a block
    (``amx_takes``), "quads" from the type's quads_from where it has decode_quads, and up to BLOCK_QUADS_MAX_TOKENS
    where it also has block_quads (where they are exact for its bias on this target:
    ``qmm.quads.quads_are_exact``), "pairs" from PAIRS_MIN_TOKENS
    where the target has AVX-512 (``qmm.pairs.pairs_are_fast``), else "tile" (the matvec up to
    MATVEC_MAX_TOKENS, then decoded blocks)."""
    pieces = _PIECES[kind]     # the pieces the kind was compiled with, even if the type was registered again
    if n_tokens >= AMX_MIN_TOKENS and amx_takes(pieces) and _qmm_amx.amx_available():
        return "amx"
    quads = (pieces.block_quads is not None and n_tokens <= BLOCK_QUADS_MAX_TOKENS) or n_tokens >= pieces.quads_from
    if pieces.decode_quads is not None and quads and quads_are_exact(pieces.quad_bias):
        return "quads"
    if n_tokens >= PAIRS_MIN_TOKENS and pairs_are_fast():
        return "pairs"
    return "tile"


def entry_point(kind: str, parallel: bool, arg_types: tuple, path: str = "tile") -> Kernel:
    """A compiled kernel, called as f(kind, w, xq, dx, xe, out); arg_types: the numba types of
    (w, xq, dx, xe, out). parallel: the prange driver; path: "tile", "pairs", "quads" or "amx" (see batch_path).

    Compiled (or loaded from numba's cache) on first use: a model whose products are all small never
    pays for its parallel drivers, which cost the most to compile, and decoding never for the batch ones."""
    if path == "amx" and not _qmm_amx.amx_available():   # also what asks Linux for the tile state: else SIGILL
        raise RuntimeError("the amx path needs AMX tiles, which this CPU or process does not have "
                           "(qmm.amx.amx_available)")
    sig = (types.literal(kind),) + tuple(arg_types)
    driver = {("tile", False): _mul_mat_serial, ("tile", True): _mul_mat_parallel,
              ("pairs", False): _mul_mat_pairs_serial, ("pairs", True): _mul_mat_pairs_parallel,
              ("quads", False): _mul_mat_quads_serial, ("quads", True): _mul_mat_quads_parallel,
              ("amx", False): _mul_mat_amx_serial, ("amx", True): _mul_mat_amx_parallel}[path, parallel]
    with warnings.catch_warnings():
        # numba's pedantic scope check flags the loop variables of pieces inlined three calls deep
        # ("variable ... is not in scope"); the generated code is unaffected (the outputs are
        # bit-identical to the hand-written kernels this skeleton replaced)
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        return driver.compile(sig)
