"""IQ3_S and IQ3_XXS encoders: ggml's quantize_iq3_s (quantize_row_iq3_s_impl, block size 32) and
quantize_iq3_xxs (quantize_row_iq3_xxs_impl(256)), byte for byte, with or without importance weights.

Per 32-element group: signs split off, |x| fitted as scale * (2l + 1), l in 0..7, four at a time on
IQ3_S's 512-point grid: 19 trial scales, each group of four rounded to its lattice point or, when that
point is not on the grid, to the best of its nearest grid points (``neighbours``: the grid points at the
3 smallest distances, ggml's iq3xs_init_impl(512)); then the winner refitted once more if any of its
points were off the grid. The super-block scale is max/31 * 1.033 in fp16, each group's a 4-bit code.
Weights: ``qw * sqrt(sigma2 + x^2)`` with importance weights qw, else ``x^2`` (sigma2: twice the mean
square of the super-block). Float arithmetic in C's float32 order, no FMA (``_kquant_encoders``).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from ggflow.quant_builtin._iq2_encoder import best_neighbour, level_sums, split_signs
from ggflow.quant_builtin._iq_grids import IQ3S_GRID, IQ3XXS_GRID
from ggflow.quant_builtin._kquant_encoders import nearest_int, round_to_fp16

f32 = np.float32
K_MAX_Q = 8


@lru_cache(maxsize=2)
def tables(grid_size: int = 512) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid (grid_size, 4) int8 levels 2l+1, kmap (4096,) int32, neighbours (m,) uint16) as
    iq3xs_init_impl(grid_size) builds them: kmap[u] is the grid index of lattice point u (3 bits per
    coordinate), or -(offset + 1) where neighbours[offset] is the count and the grid indices follow,
    nearest first (distance, then index): the points at the nwant smallest distances (3 for IQ3_S's 512
    points, 2 for IQ3_XXS's 256)."""
    levels = IQ3S_GRID if grid_size == 512 else IQ3XXS_GRID   # the decoders' levels, 8 distinct values
    grid = (2 * np.searchsorted(np.unique(levels), levels) + 1).astype(np.int8)   # as level index l: 2l + 1
    nwant = 3 if grid_size == 512 else 2
    index = (((grid.astype(np.int32) - 1) // 2) << np.array([0, 3, 6, 9])).sum(axis=1)
    kmap = np.full(4096, -1, np.int32)
    kmap[index] = np.arange(len(grid))
    points = 2 * ((np.arange(4096)[:, None] >> np.array([0, 3, 6, 9])) & 7) + 1        # (4096, 4)
    dist = ((grid[None, :, :].astype(np.int32) - points[:, None, :]) ** 2).sum(axis=2)  # (4096, 512)
    neighbours: list[int] = []
    order = np.arange(len(grid))
    for u in np.flatnonzero(kmap < 0):             # once per process, one per lattice point off the grid
        d = dist[u]
        ranked = np.lexsort((order, d))
        cut = np.unique(d)[nwant - 1]
        take = ranked[d[ranked] <= cut]
        kmap[u] = -(len(neighbours) + 1)
        neighbours += [len(take), *take.tolist()]
    return grid, kmap, np.array(neighbours, np.uint16)


@njit(cache=True, fastmath=False)
def _lattice(xval, id_, k):
    u = 0
    for i in range(4):
        l = max(0, min(K_MAX_Q - 1, nearest_int(f32(0.5) * (id_ * xval[4 * k + i] - f32(1.0)))))
        u |= l << (3 * i)
    return u


@njit(cache=True, fastmath=False, nogil=True)
def quantize_iq3_s(blocks, qw, has_qw, grid, kmap, neighbours, out):
    """blocks (n, 256) f32, qw the same shape (read if has_qw), out (n, 110) uint8."""
    weight, xval, waux = np.empty(32, np.float32), np.empty(32, np.float32), np.empty(32, np.float32)
    L, Laux = np.zeros(32, np.int64), np.zeros(32, np.int64)
    on_grid, on_grid_aux = np.zeros(8, np.bool_), np.zeros(8, np.bool_)
    block_signs = np.zeros(4, np.uint8)
    scales = np.zeros(8, np.float32)
    for ibl in range(blocks.shape[0]):
        x, y = blocks[ibl], out[ibl]
        y[:] = 0
        qs, qh, signs = y[2:66], y[66:74], y[74:106]
        max_scale = f32(0.0)
        sumx2 = f32(0.0)
        for i in range(256):
            sumx2 += x[i] * x[i]
        sigma2 = f32(2.0) * sumx2 / f32(256.0)
        for ib in range(8):
            xb = x[32 * ib:32 * ib + 32]
            for i in range(32):
                if has_qw:
                    weight[i] = qw[ibl, 32 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
                else:
                    weight[i] = xb[i] * xb[i]
            for i in range(32):
                waux[i] = np.sqrt(weight[i])
            for k in range(4):
                s = 0
                for i in range(8):
                    if xb[8 * k + i] >= 0:
                        xval[8 * k + i] = xb[8 * k + i]
                    else:
                        xval[8 * k + i] = -xb[8 * k + i]
                        s |= 1 << i
                block_signs[k] = s
            vmax = xval[0]
            for i in range(1, 32):
                vmax = max(vmax, xval[i])
            L[:] = 0
            if vmax == 0:
                scales[ib] = 0
                continue
            best = f32(0.0)
            scale = vmax / f32(2 * K_MAX_Q - 1)
            on_grid[:] = False
            for step in range(-9, 10):
                id_ = (f32(2 * K_MAX_Q - 1) + f32(step) * f32(0.2)) / vmax
                this_scale = f32(1.0) / id_
                for k in range(8):
                    u = _lattice(xval, id_, k)
                    for i in range(4):
                        Laux[4 * k + i] = (u >> (3 * i)) & 7
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        best_neighbour(neighbours, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4], waux[4 * k:4 * k + 4],
                                        this_scale, Laux[4 * k:4 * k + 4])
                sumqx, sumq2 = level_sums(weight, xval, Laux)
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    L[:] = Laux
                    on_grid[:] = on_grid_aux
            n_off = 0
            for k in range(8):
                if not on_grid[k]:
                    n_off += 1
            if n_off > 0 and scale > 0:
                id_ = f32(1.0) / scale
                for k in range(8):
                    u = _lattice(xval, id_, k)
                    g = kmap[u]
                    if g < 0:
                        g = best_neighbour(neighbours, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4],
                                            waux[4 * k:4 * k + 4], scale, L[4 * k:4 * k + 4])
                    for i in range(4):
                        L[4 * k + i] = (grid[g, i] - 1) // 2
                sumqx, sumq2 = level_sums(weight, xval, L)
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(4):
                    block_signs[k] = ~block_signs[k]
            for k in range(8):           # 8 groups of four: grid indices, low byte in qs, 9th bit in qh
                u = 0
                for i in range(4):
                    u |= L[4 * k + i] << (3 * i)
                g = kmap[u]
                qs[8 * ib + k] = g & 255
                qh[(ib * 8 + k) // 8] |= (g >> 8) << ((ib * 8 + k) % 8)
            for k in range(4):           # 4 sign bytes of 8 elements
                signs[4 * ib + k] = block_signs[k]
            scales[ib] = scale
            max_scale = max(max_scale, scale)
        if max_scale == 0:
            continue
        d = max_scale / f32(31.0)
        round_to_fp16(y, 0, d * f32(1.033))
        id_ = f32(1.0) / d
        for ib in range(0, 8, 2):
            l1 = max(0, min(15, nearest_int(f32(0.5) * (id_ * scales[ib] - f32(1.0)))))
            l2 = max(0, min(15, nearest_int(f32(0.5) * (id_ * scales[ib + 1] - f32(1.0)))))
            y[106 + ib // 2] = l1 | (l2 << 4)


@njit(cache=True, fastmath=False, nogil=True)
def quantize_iq3_xxs(blocks, qw, has_qw, grid, kmap, neighbours, out):
    """quantize_row_iq3_xxs_impl(256, ...): blocks (n, 256) f32, qw the same shape (read if has_qw), out (n, 98)
    uint8: d, 64 grid indices, 8 u32 of 4 x 7-bit sign indices + 4-bit scale. As IQ3_S but: an even number of
    sign flips per 8 (an odd count flips the element of least weight * x^2 back), 31 trial scales, only
    off-grid groups refitted, d = max/31 * 1.0125."""
    weight, xval, waux = np.empty(32, np.float32), np.empty(32, np.float32), np.empty(32, np.float32)
    L, Laux = np.zeros(32, np.int64), np.zeros(32, np.int64)
    on_grid, on_grid_aux = np.zeros(8, np.bool_), np.zeros(8, np.bool_)
    block_signs = np.zeros(4, np.int64)
    scales = np.zeros(8, np.float32)
    sas = np.zeros(8, np.int64)
    for ibl in range(blocks.shape[0]):
        x, y = blocks[ibl], out[ibl]
        y[:] = 0
        sas[:] = 0
        max_scale = f32(0.0)
        sumx2 = f32(0.0)
        for i in range(256):
            sumx2 += x[i] * x[i]
        sigma2 = f32(2.0) * sumx2 / f32(256.0)
        for ib in range(8):
            xb = x[32 * ib:32 * ib + 32]
            for i in range(32):
                if has_qw:
                    weight[i] = qw[ibl, 32 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
                else:
                    weight[i] = xb[i] * xb[i]
            for i in range(32):
                waux[i] = np.sqrt(weight[i])
            split_signs(xb, weight, xval, block_signs, 4, True)
            vmax = xval[0]
            for i in range(1, 32):
                vmax = max(vmax, xval[i])
            L[:] = 0
            if vmax < f32(1e-8):
                scales[ib] = 0
                continue
            best = f32(0.0)
            scale = vmax / f32(2 * K_MAX_Q - 1)
            on_grid[:] = True
            for step in range(-15, 16):
                id_ = (f32(2 * K_MAX_Q - 1) + f32(step) * f32(0.2)) / vmax
                this_scale = f32(1.0) / id_
                for k in range(8):
                    u = _lattice(xval, id_, k)
                    for i in range(4):
                        Laux[4 * k + i] = (u >> (3 * i)) & 7
                    on_grid_aux[k] = True
                    if kmap[u] < 0:
                        on_grid_aux[k] = False
                        best_neighbour(neighbours, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4], waux[4 * k:4 * k + 4],
                                        this_scale, Laux[4 * k:4 * k + 4])
                sumqx, sumq2 = level_sums(weight, xval, Laux)
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    L[:] = Laux
                    on_grid[:] = on_grid_aux
            n_off = 0
            for k in range(8):
                if not on_grid[k]:
                    n_off += 1
            if n_off > 0 and scale > 0:
                id_ = f32(1.0) / scale
                for k in range(8):
                    if on_grid[k]:
                        continue
                    u = _lattice(xval, id_, k)
                    g = kmap[u]
                    if g < 0:
                        g = best_neighbour(neighbours, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4],
                                            waux[4 * k:4 * k + 4], scale, L[4 * k:4 * k + 4])
                    for i in range(4):
                        L[4 * k + i] = (grid[g, i] - 1) // 2
                sumqx, sumq2 = level_sums(weight, xval, L)
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(4):
                    block_signs[k] = (~block_signs[k]) & 127
            for k in range(8):
                u = 0
                for i in range(4):
                    u |= L[4 * k + i] << (3 * i)
                y[2 + 8 * ib + k] = kmap[u]
            sas[ib] = block_signs[0] | (block_signs[1] << 7) | (block_signs[2] << 14) | (block_signs[3] << 21)
            scales[ib] = scale
            max_scale = max(max_scale, scale)
        if max_scale == 0:
            y[:] = 0
            continue
        d = max_scale / f32(31.0)
        round_to_fp16(y, 0, d * f32(1.0125))
        id_ = f32(1.0) / d
        for ib in range(8):
            l = max(0, min(15, nearest_int(f32(0.5) * (id_ * scales[ib] - f32(1.0)))))
            v = sas[ib] | (l << 28)
            for b in range(4):
                y[66 + 4 * ib + b] = (v >> (8 * b)) & 0xFF
