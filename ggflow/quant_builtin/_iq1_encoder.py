"""IQ1_S encoder: ggml's quantize_iq1_s (quantize_row_iq1_s_impl), byte for byte; importance weights required.

Per 32-element group the values are coded as scale * (q + delta), q in {-1, 0, 1}, delta = +-1/8 for the
group: the elements sorted (stably, as glibc's qsort sorts 32 pairs), every split of them into three runs
scored exactly from prefix sums, for both deltas; then each group of eight mapped to its point on the
2048-point grid, or the best of its nearest grid points (``_iq2_encoder.tables(2048)``: the points at the
3 smallest distances), and the scale refitted if any was off the grid. d = max/15 * 1.125, group scales
3-bit with the delta's sign. Float rules: ``_kquant_encoders``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.quant_builtin._kquant_encoders import nearest_int, round_to_fp16

f32 = np.float32
DELTA = f32(0.125)


@njit(cache=True, fastmath=False, nogil=True)
def quantize_iq1_s(blocks, qw, grid, kmap, neighbours, out):
    """blocks and qw (n, 256) f32; out (n, 50): d, 32 grid low bytes, 8 u16 (3 high index bits x 4, 3-bit
    scale << 12, delta sign << 15)."""
    x_p = np.array([f32(-1.0) + DELTA, DELTA, f32(1.0) + DELTA], np.float32)
    x_m = np.array([f32(-1.0) - DELTA, -DELTA, f32(1.0) - DELTA], np.float32)
    weight = np.empty(32, np.float32)
    sumx, sumw = np.zeros(33, np.float32), np.zeros(33, np.float32)
    L = np.zeros(32, np.int64)
    index = np.zeros(4, np.int64)
    scales = np.zeros(8, np.float32)
    shifts = np.zeros(8, np.int64)
    qh = np.zeros(8, np.int64)
    for ibl in range(blocks.shape[0]):
        x, y = blocks[ibl], out[ibl]
        y[:] = 0
        qh[:] = 0
        max_scale = f32(0.0)
        sumx2 = f32(0.0)
        for i in range(256):
            sumx2 += x[i] * x[i]
        sigma2 = f32(2.0) * sumx2 / f32(256.0)
        for ib in range(8):
            xb = x[32 * ib:32 * ib + 32]
            for i in range(32):
                weight[i] = qw[ibl, 32 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
            vmax = abs(xb[0])
            for i in range(1, 32):
                vmax = max(vmax, abs(xb[i]))
            if vmax < f32(1e-12):
                scales[ib] = 0
                shifts[ib] = 1
                continue
            order = np.argsort(xb, kind="mergesort")
            sumx[0] = 0
            sumw[0] = 0
            for j in range(32):
                i = order[j]
                sumx[j + 1] = sumx[j] + weight[i] * xb[i]
                sumw[j + 1] = sumw[j] + weight[i]
            best_score = f32(-3.4028234663852886e38)
            scale = vmax
            besti1, besti2, best_shift = -1, -1, 0
            for i1 in range(33):
                for i2 in range(i1, 33):
                    for sh in range(2):
                        xx = x_p if sh == 0 else x_m
                        sumqx = ((sumx[i1] - sumx[0]) * xx[0] + (sumx[i2] - sumx[i1]) * xx[1]
                                 + (sumx[32] - sumx[i2]) * xx[2])
                        sumq2 = ((sumw[i1] - sumw[0]) * xx[0] * xx[0] + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
                                 + (sumw[32] - sumw[i2]) * xx[2] * xx[2])
                        if sumq2 > 0 and sumqx * sumqx > best_score * sumq2:
                            scale = sumqx / sumq2
                            best_score = scale * sumqx
                            besti1 = i1
                            besti2 = i2
                            best_shift = 1 if sh == 0 else -1
            if besti1 < 0 or besti2 < 0 or best_shift == 0:
                scales[ib] = 0
                shifts[ib] = 1
                continue
            for j in range(32):
                L[order[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
            if scale < 0:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale = -scale
                best_shift = -best_shift
            xx = x_p if best_shift == 1 else x_m
            all_on_grid = True
            for k in range(4):
                u = 0
                for j in range(8):
                    u |= L[8 * k + j] << (2 * j)
                g = kmap[u]
                if g < 0:
                    all_on_grid = False
                    start = -kmap[u] - 1
                    best_d2 = f32(3.4028234663852886e38)
                    for jj in range(1, neighbours[start] + 1):
                        cand = neighbours[start + jj]
                        d2 = f32(0.0)
                        for i in range(8):
                            q = xx[(grid[cand, i] - 1) // 2]
                            diff = scale * q - xb[8 * k + i]
                            d2 += weight[8 * k + i] * diff * diff
                        if d2 < best_d2:
                            best_d2 = d2
                            g = cand
                    for i in range(8):
                        L[8 * k + i] = (grid[g, i] - 1) // 2
                index[k] = g
            if not all_on_grid:
                sumqx = f32(0.0)
                sumq2 = f32(0.0)
                for k in range(4):
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[(grid[index[k], j] - 1) // 2]
                        sumqx += w * q * xb[8 * k + j]
                        sumq2 += w * q * q
                if sumqx > 0 and sumq2 > 0:
                    scale = sumqx / sumq2
            h = 0
            for k in range(4):
                y[2 + 4 * ib + k] = index[k] & 255
                h |= (index[k] >> 8) << (3 * k)
            qh[ib] = h
            scales[ib] = scale
            shifts[ib] = best_shift
            max_scale = max(max_scale, scale)
        if max_scale == 0:
            continue
        d = max_scale / f32(15.0)
        round_to_fp16(y, 0, d * f32(1.125))
        id_ = f32(1.0) / d
        for ib in range(8):
            l = max(0, min(7, nearest_int(f32(0.5) * (id_ * scales[ib] - f32(1.0)))))
            if shifts[ib] == -1:
                l |= 8
            v = qh[ib] | (l << 12)
            y[34 + 2 * ib] = v & 0xFF
            y[35 + 2 * ib] = (v >> 8) & 0xFF
