"""Products of one activation by one to three weights of one type in one call: a layer's Q, K and V; gate and up.

On two threads a decode step of a small model pays per parallel region (a wake-up of the other thread and a
join): SmolLM2's 192 x 576 K and V products were too small to pay for a region of their own and ran serially
beside the parallel Q. Here the weights' row tiles are laid end to end, one tile range over all of them: the
serial driver runs them in order, the parallel one splits the whole range among the threads (Q, K and V are
15 tiles for two threads, not 9 parallel and 3 + 3 on one). Each tile is computed by the same tile function
as a product of its own (``qmm.template``), so every output is the same bits.

Bound groups (``quant_matmul.bind_mul_mats``) on the paths a decode step and a short prompt take ("tile" and
"quads": the matvec and the packed-word quads) run these drivers, and so do a single bound product's parallel calls,
as a group of one: a loaded parallel driver holds ~2.3 MiB of code, so a plan loads one per type, not the
template's and this one (``quant_matmul._bound_products``). Products on another path (pairs, AMX: prompts, where a
call's cost is nothing beside its work) run the template's drivers, a group's one product after another; so does
the unbound ``mul_mat``.

The weights are of one kind, packed into arrays of the same numba types, so one compiled group kernel reads them all;
its arguments are the template drivers', with the weights and the outputs as three of each (``group_args``).
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
from numba import literally, njit, prange, types
from numba.core.errors import NumbaIRAssumptionWarning

from ggflow.backends_builtin.cpu.products.qmm.template import (
    _activation_group_sums, _mul_mat_quads_tiles, _mul_mat_tiles, _thread_share, _threads_now)

GROUP_PATHS = ("tile", "quads")
MAX_WEIGHTS = 3    # a group's most weights: a layer's q, k and v


# A group comes as three weights and outputs, w0 .. w2 and o0 .. o2, the first ``count`` of them real (a group of one
# or two passes its last again): numba's parallel loops take a tuple of arrays (one weight's packs) but not a tuple
# of them.
@njit(cache=True, inline="always")
def _starts(count, w0, w1, w2):
    """Where weight 1's and weight 2's tiles start in the group's (their end where they are not real), and the
    group's tile count."""
    s1 = w0[0].shape[0]
    s2 = s1 + (w1[0].shape[0] if count >= 2 else 0)
    return s1, s2, s2 + (w2[0].shape[0] if count == 3 else 0)


@njit(cache=True, inline="always")
def _span(start, n, g0, g1):
    """(first, end) of a weight's own tiles, which are the group's start .. start + n - 1, within g0 .. g1-1."""
    return max(np.int64(g0) - start, 0), min(np.int64(g1) - start, n)


@njit(cache=True, nogil=True)
def _tiles(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2, g0, g1):
    """The group's tiles g0 .. g1-1 on the matvec / tile path: each weight's after the weights before it."""
    literally(kind)
    s1, s2, total = _starts(count, w0, w1, w2)
    t0, t1 = _span(0, s1, g0, g1)
    if t0 < t1:
        _mul_mat_tiles(kind, w0, xq, dx, xe, o0, t0, t1)
    t0, t1 = _span(s1, s2 - s1, g0, g1)
    if t0 < t1:
        _mul_mat_tiles(kind, w1, xq, dx, xe, o1, t0, t1)
    t0, t1 = _span(s2, total - s2, g0, g1)
    if t0 < t1:
        _mul_mat_tiles(kind, w2, xq, dx, xe, o2, t0, t1)


@njit(cache=True, nogil=True)
def _serial(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2):
    literally(kind)
    _tiles(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2, np.int64(0), _starts(count, w0, w1, w2)[2])


@njit(cache=True, parallel=True, nogil=True)
def _parallel(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2):
    literally(kind)
    total = _starts(count, w0, w1, w2)[2]
    chunks = min(total, _threads_now())
    for c in prange(chunks):
        g0, g1 = _thread_share(c, chunks, total)
        _tiles(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2, g0, g1)


@njit(cache=True, nogil=True)
def _quads_tiles(kind, count, w0, w1, w2, x8, xs, dx, xe, o0, o1, o2, g0, g1):
    """The group's tiles g0 .. g1-1 on the quads path (x8, xs made once for all the weights)."""
    literally(kind)
    s1, s2, total = _starts(count, w0, w1, w2)
    t0, t1 = _span(0, s1, g0, g1)
    if t0 < t1:
        _mul_mat_quads_tiles(kind, w0, x8, xs, dx, xe, o0, t0, t1)
    t0, t1 = _span(s1, s2 - s1, g0, g1)
    if t0 < t1:
        _mul_mat_quads_tiles(kind, w1, x8, xs, dx, xe, o1, t0, t1)
    t0, t1 = _span(s2, total - s2, g0, g1)
    if t0 < t1:
        _mul_mat_quads_tiles(kind, w2, x8, xs, dx, xe, o2, t0, t1)


@njit(cache=True, nogil=True)
def _quads_serial(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2):
    literally(kind)
    x8 = xq.astype(np.int8)      # quantized activations fit a byte
    xs = _activation_group_sums(kind, x8)
    _quads_tiles(kind, count, w0, w1, w2, x8, xs, dx, xe, o0, o1, o2, np.int64(0), _starts(count, w0, w1, w2)[2])


@njit(cache=True, parallel=True, nogil=True)
def _quads_parallel(kind, count, w0, w1, w2, xq, dx, xe, o0, o1, o2):
    literally(kind)
    x8 = xq.astype(np.int8)
    xs = _activation_group_sums(kind, x8)
    total = _starts(count, w0, w1, w2)[2]
    chunks = min(total, _threads_now())
    for c in prange(chunks):
        g0, g1 = _thread_share(c, chunks, total)
        _quads_tiles(kind, count, w0, w1, w2, x8, xs, dx, xe, o0, o1, o2, g0, g1)


def group_args(kind: str, ws: Sequence[tuple], acts: tuple, outs: Sequence[np.ndarray]) -> tuple:
    """The drivers' arguments for the packed arrays ws of one to three weights, their quantized activations
    (xq, dx, xe) and their outputs."""
    if not 1 <= len(ws) <= MAX_WEIGHTS or len(outs) != len(ws):
        raise ValueError(f"a group takes 1 to {MAX_WEIGHTS} weights and as many outputs, got {len(ws)} and {len(outs)}")
    pad = MAX_WEIGHTS - len(ws)
    return (kind, len(ws), *ws, *ws[-1:] * pad, *acts, *outs, *outs[-1:] * pad)


def entry_point(kind: str, parallel: bool, arg_types: tuple, path: str):
    """The compiled group kernel, called with ``group_args``; arg_types: the numba types of (w, xq, dx, xe, out)
    for one weight; path one of GROUP_PATHS. Compiled (or loaded from numba's cache) on first use."""
    driver = {("tile", False): _serial, ("tile", True): _parallel,
              ("quads", False): _quads_serial, ("quads", True): _quads_parallel}[path, parallel]
    with warnings.catch_warnings():   # as qmm.template.entry_point: numba's pedantic scope check on inlined pieces
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        w, *acts, out = arg_types
        return driver.compile((types.literal(kind), types.int64, *(w,) * MAX_WEIGHTS, *acts, *(out,) * MAX_WEIGHTS))
