"""IQ2_XXS, IQ2_XS and IQ2_S encoders: ggml's quantize_iq2_xxs / _xs / _s (quantize_row_iq2_*_impl), byte
for byte. IQ2_XXS and IQ2_XS need importance weights, as in ggml (which asserts them; llama-quantize
refuses the types without an imatrix); IQ2_S takes them optionally. IQ2_XXS below; IQ2_XS and IQ2_S are
described at their shared body, ``_iq2_16``.

Per 32-element group: signs split off with an even number of flips per 8 (an odd count flips the element
of least weight * x^2 back), |x| fitted as scale * (2l + 1), l in 0..2, eight at a time on the 256-point
E8 grid: an initial scale from make_qp_quants, 13 trial scales, each group of eight rounded to its lattice
point or, when that is not on the grid, the best of its nearest grid points (``tables``: the points at the
2 smallest distances, as iq2xs_init_impl builds them), then one refit. d = max/31, group scales 4-bit.
Weights ``qw * sqrt(sigma2 + x^2)``, sigma2 the super-block's mean square. Float rules: ``_kquant_encoders``.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import product

import numpy as np
from numba import njit

from ggflow.quant_builtin._iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID
from ggflow.quant_builtin._kquant_encoders import GROUP_MAX_EPS, nearest_int, round_to_fp16
from ggflow.quant_builtin._kquant_weighted import make_qp_quants

f32 = np.float32
_GRIDS = {256: (IQ2XXS_GRID, 2), 512: (IQ2XS_GRID, 2), 1024: (IQ2S_GRID, 1), 2048: (IQ1S_GRID, 3)}


@lru_cache(maxsize=4)
def tables(grid_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid (grid_size, 8) int8 levels 2l+1, kmap (65536,) int32, neighbours (m,) uint16), as
    iq2xs_init_impl builds them for the lattice points the encoder can ask for (each l in 0..2): kmap[u] is
    the grid index of point u (2 bits per coordinate) or -(offset + 1), neighbours[offset] the count and
    the grid indices nearest first (distance, then index) at the nwant smallest distances."""
    levels, nwant = _GRIDS[grid_size]
    grid = (2 * np.searchsorted(np.unique(levels), levels) + 1).astype(np.int8)
    shifts = 2 * np.arange(8)
    kmap = np.full(1 << 16, -1, np.int32)
    kmap[(((grid.astype(np.int64) - 1) // 2) << shifts).sum(axis=1)] = np.arange(grid_size)
    ls = np.array(list(product(range(3), repeat=8)), np.int64)[:, ::-1]        # every point with l <= 2
    us = (ls << shifts).sum(axis=1)
    off = kmap[us] < 0
    ls, us = ls[off], us[off]
    dist = ((grid[None].astype(np.int64) - (2 * ls[:, None, :] + 1)) ** 2).sum(axis=2)   # (points, grid)
    order = np.argsort(dist * grid_size + np.arange(grid_size), axis=1, kind="stable")  # distance, then index
    d_sorted = np.take_along_axis(dist, order, axis=1)
    rank = np.concatenate([np.zeros((len(us), 1), np.int64), np.cumsum(np.diff(d_sorted, axis=1) != 0, axis=1)],
                          axis=1)
    keep = rank < nwant
    counts = keep.sum(axis=1)
    starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
    neighbours = np.zeros(int((counts + 1).sum()), np.uint16)
    neighbours[starts] = counts
    rows, cols = np.nonzero(keep)
    neighbours[starts[rows] + 1 + cols] = order[rows, cols]
    kmap[us] = -(starts + 1)
    return grid, kmap, neighbours


@njit(cache=True, fastmath=False)
def best_neighbour(neighbours, start, grid, xval, waux, scale, L):
    """iq2/iq3_find_best_neighbour: the listed grid point nearest xval (weights waux) at `scale`, over a group of
    grid.shape[1] elements (8 for IQ2, 4 for IQ3); L gets its levels."""
    width = grid.shape[1]
    n = neighbours[start]
    best_d2 = f32(3.4028234663852886e38)
    grid_index = -1
    for j in range(1, n + 1):
        g = neighbours[start + j]
        d2 = f32(0.0)
        for i in range(width):
            diff = scale * f32(grid[g, i]) - xval[i]
            d2 += waux[i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            grid_index = g
    for i in range(width):
        L[i] = (grid[grid_index, i] - 1) // 2
    return grid_index


@njit(cache=True, fastmath=False)
def _lattice8(xval, id_, k, kmax):
    u = 0
    for i in range(8):
        l = max(0, min(kmax - 1, nearest_int(f32(0.5) * (id_ * xval[8 * k + i] - f32(1.0)))))
        u |= l << (2 * i)
    return u


@njit(cache=True, fastmath=False)
def level_sums(weight, xval, L):
    """The weighted sums of a 32-element block at levels L (value 2 L + 1): sum w x q and sum w q^2."""
    sumqx = f32(0.0)
    sumq2 = f32(0.0)
    for i in range(32):
        w = weight[i]
        q = f32(2 * L[i] + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit(cache=True, fastmath=False)
def split_signs(xb, weight, xval, block_signs, n_groups, even):
    """|x| into xval and each group of 8's sign bits into block_signs[k] (ggml's i-quant encoders). With
    ``even`` an odd count of flips in a group flips back its element of least weight * x^2, and 7 bits are
    stored (the 8th is their parity); otherwise all 8."""
    for k in range(n_groups):
        nflip = 0
        s = 0
        for i in range(8):
            if xb[8 * k + i] >= 0:
                xval[8 * k + i] = xb[8 * k + i]
            else:
                xval[8 * k + i] = -xb[8 * k + i]
                nflip += 1
                s |= 1 << i
        if even and nflip % 2:
            imin = 0
            vmin = weight[8 * k] * xb[8 * k] * xb[8 * k]
            for i in range(1, 8):
                ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i]
                if ax < vmin:
                    vmin = ax
                    imin = i
            xval[8 * k + imin] = -xval[8 * k + imin]
            s ^= 1 << imin
        block_signs[k] = s & 127 if even else s


@njit(cache=True, fastmath=False, nogil=True)
def quantize_iq2_xxs(blocks, qw, grid, kmap, neighbours, out):
    """blocks and qw (n, 256) f32, out (n, 66) uint8: d, then per group u32 (4 grid bytes), u32 (4 x 7 sign
    bits, 4-bit scale)."""
    kmax = 3
    weight, xval, waux = np.empty(32, np.float32), np.empty(32, np.float32), np.empty(32, np.float32)
    L, Laux, Lqp = np.zeros(32, np.int64), np.zeros(32, np.int64), np.zeros(32, np.int64)
    block_signs = np.zeros(4, np.int64)
    scales = np.zeros(8, np.float32)
    q2 = np.zeros(16, np.int64)
    for ibl in range(blocks.shape[0]):
        x, y = blocks[ibl], out[ibl]
        y[:] = 0
        q2[:] = 0
        max_scale = f32(0.0)
        sumx2 = f32(0.0)
        for i in range(256):
            sumx2 += x[i] * x[i]
        sigma2 = sumx2 / f32(256.0)
        for ib in range(8):
            xb = x[32 * ib:32 * ib + 32]
            for i in range(32):
                weight[i] = qw[ibl, 32 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
            for i in range(32):
                waux[i] = np.sqrt(weight[i])
            split_signs(xb, weight, xval, block_signs, 4, True)
            vmax = xval[0]
            for i in range(1, 32):
                vmax = max(vmax, xval[i])
            if vmax < GROUP_MAX_EPS:
                scales[ib] = 0
                L[:] = 0
                continue
            scale = make_qp_quants(xval, kmax + 1, Lqp, weight)
            for i in range(32):
                L[i] = Lqp[i] - 256 if Lqp[i] > 127 else Lqp[i]   # C's int8 view of make_qp_quants' bytes
            eff_max = scale * f32(kmax)
            if eff_max <= 0:
                scales[ib] = 0
                L[:] = 0
                continue
            best = f32(0.0)
            for step in range(-6, 7):
                id_ = (f32(2 * kmax - 1) + f32(step) * f32(0.1)) / eff_max
                this_scale = f32(1.0) / id_
                for k in range(4):
                    u = _lattice8(xval, id_, k, kmax)
                    for i in range(8):
                        Laux[8 * k + i] = (u >> (2 * i)) & 3
                    if kmap[u] < 0:
                        best_neighbour(neighbours, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8],
                                        this_scale, Laux[8 * k:8 * k + 8])
                sumqx, sumq2 = level_sums(weight, xval, Laux)
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    L[:] = Laux
            if scale > 0:
                id_ = f32(1.0) / scale
                for k in range(4):
                    u = _lattice8(xval, id_, k, kmax)
                    g = kmap[u]
                    if g < 0:
                        g = best_neighbour(neighbours, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8],
                                            waux[8 * k:8 * k + 8], scale, L[8 * k:8 * k + 8])
                    for i in range(8):
                        L[8 * k + i] = (grid[g, i] - 1) // 2
                sumqx, sumq2 = level_sums(weight, xval, L)
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(4):
                    block_signs[k] = (~block_signs[k]) & 127
            for k in range(4):
                u = 0
                for i in range(8):
                    u |= L[8 * k + i] << (2 * i)
                q2[2 * ib] |= kmap[u] << (8 * k)
                q2[2 * ib + 1] |= block_signs[k] << (7 * k)
            scales[ib] = scale
            max_scale = max(max_scale, scale)
        if max_scale == 0:
            continue
        d = max_scale / f32(31.0)
        round_to_fp16(y, 0, d)
        id_ = f32(1.0) / d
        for ib in range(8):
            l = max(0, min(15, nearest_int(f32(0.5) * (id_ * scales[ib] - f32(1.0)))))
            q2[2 * ib + 1] |= l << 28
        for j in range(16):
            for b in range(4):
                y[2 + 4 * j + b] = (q2[j] >> (8 * b)) & 0xFF


@njit(cache=True, fastmath=False)
def _iq2_16(blocks, qw, has_qw, grid, kmap, neighbours, out, is_s):
    """quantize_row_iq2_xs_impl (is_s False) and quantize_row_iq2_s_impl (True): per 16 elements (two groups of
    eight on the grid) a scale; 19 trial scales from max/5, then the off-grid groups refitted once.
    IQ2_XS out (n, 74): d, 32 u16 (9-bit grid index | 7 sign bits << 9), 8 bytes of two 4-bit scales; signs
    with an even number of flips. IQ2_S out (n, 82): d, 32 grid low bytes, 32 sign bytes (all 8 bits), 8 qh
    bytes (2 high index bits each), 8 scale bytes; sigma2 doubled, d * 0.9875, weights without an imatrix
    sigma2/4 + x^2."""
    kmax = 3
    weight, xval, waux = np.empty(16, np.float32), np.empty(16, np.float32), np.empty(16, np.float32)
    L, Laux = np.zeros(16, np.int64), np.zeros(16, np.int64)
    on_grid, on_grid_aux = np.zeros(2, np.bool_), np.zeros(2, np.bool_)
    block_signs = np.zeros(4, np.int64)
    scales = np.zeros(16, np.float32)
    q2 = np.zeros(32, np.int64)
    for ibl in range(blocks.shape[0]):
        x, y = blocks[ibl], out[ibl]
        y[:] = 0
        q2[:] = 0
        max_scale = f32(0.0)
        sumx2 = f32(0.0)
        for i in range(256):
            sumx2 += x[i] * x[i]
        sigma2 = (f32(2.0) * sumx2 if is_s else sumx2) / f32(256.0)
        for ib in range(16):
            xb = x[16 * ib:16 * ib + 16]
            for i in range(16):
                if has_qw:
                    weight[i] = qw[ibl, 16 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
                else:
                    weight[i] = f32(0.25) * sigma2 + xb[i] * xb[i]
            for i in range(16):
                waux[i] = np.sqrt(weight[i])
            split_signs(xb, weight, xval, block_signs, 2, not is_s)
            vmax = xval[0]
            for i in range(1, 16):
                vmax = max(vmax, xval[i])
            L[:] = 0
            if vmax < (f32(1e-8) if is_s else GROUP_MAX_EPS):
                scales[ib] = 0
                continue
            best = f32(0.0)
            scale = vmax / f32(2 * kmax - 1)
            on_grid[:] = True
            for step in range(-9, 10):
                id_ = (f32(2 * kmax - 1) + f32(step) * f32(0.1)) / vmax
                this_scale = f32(1.0) / id_
                for k in range(2):
                    u = _lattice8(xval, id_, k, kmax)
                    for i in range(8):
                        Laux[8 * k + i] = (u >> (2 * i)) & 3
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        best_neighbour(neighbours, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8],
                                        this_scale, Laux[8 * k:8 * k + 8])
                sumqx = f32(0.0)
                sumq2 = f32(0.0)
                for i in range(16):
                    w = weight[i]
                    q = f32(2 * Laux[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    L[:] = Laux
                    on_grid[:] = on_grid_aux
            if (not on_grid[0] or not on_grid[1]) and scale > 0:
                id_ = f32(1.0) / scale
                for k in range(2):
                    if on_grid[k]:
                        continue
                    u = _lattice8(xval, id_, k, kmax)
                    for i in range(8):
                        L[8 * k + i] = (u >> (2 * i)) & 3
                    if kmap[u] < 0:
                        best_neighbour(neighbours, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8],
                                        scale, L[8 * k:8 * k + 8])
                sumqx = f32(0.0)
                sumq2 = f32(0.0)
                for i in range(16):
                    w = weight[i]
                    q = f32(2 * L[i] + 1)
                    sumqx += w * xval[i] * q
                    sumq2 += w * q * q
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(2):
                    block_signs[k] = (~block_signs[k]) & (255 if is_s else 127)
            for k in range(2):
                u = 0
                for i in range(8):
                    u |= L[8 * k + i] << (2 * i)
                if is_s:
                    i8 = 2 * ib + k
                    y[2 + i8] = kmap[u] & 255
                    y[66 + i8 // 4] |= (kmap[u] >> 8) << (2 * (i8 % 4))
                    y[34 + i8] = block_signs[k]
                else:
                    q2[2 * ib + k] = kmap[u] | (block_signs[k] << 9)
            scales[ib] = scale
            max_scale = max(max_scale, scale)
        if max_scale == 0:
            continue
        d = max_scale / f32(31.0)
        round_to_fp16(y, 0, d * f32(0.9875) if is_s else d)
        id_ = f32(1.0) / d
        at = 74 if is_s else 66
        for ib in range(16):
            l = max(0, min(15, nearest_int(f32(0.5) * (id_ * scales[ib] - f32(1.0)))))
            if ib % 2 == 0:
                y[at + ib // 2] = l
            else:
                y[at + ib // 2] |= l << 4
        if not is_s:
            for j in range(32):
                y[2 + 2 * j] = q2[j] & 0xFF
                y[3 + 2 * j] = (q2[j] >> 8) & 0xFF


@njit(cache=True, fastmath=False, nogil=True)
def quantize_iq2_xs(blocks, qw, grid, kmap, neighbours, out):
    _iq2_16(blocks, qw, True, grid, kmap, neighbours, out, False)


@njit(cache=True, fastmath=False, nogil=True)
def quantize_iq2_s(blocks, qw, has_qw, grid, kmap, neighbours, out):
    _iq2_16(blocks, qw, has_qw, grid, kmap, neighbours, out, True)
