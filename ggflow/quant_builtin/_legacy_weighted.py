"""numba kernels for the legacy encoders given importance weights: ggml's quantize_row_q4_0_impl,
q4_1, q5_0 and q5_1 ``_impl``, byte for byte (ggml_quantize_chunk with an imatrix).

Each weighs an element by ``qw * sqrt(sigma2 + x^2)`` with sigma2 the mean square of its whole *row*
(not its block), so these take rows: ``quantize_<type>_w(rows, qw, out)`` with rows and qw
(n_rows, n_per_row) float32 and out (n_rows, n_per_row / 32 * type_size). Q4_0 / Q5_0 fit each block
with the weighted make_qx_quants (rmse_type 1), Q4_1 / Q5_1 with make_qkx3_quants. Same float rules as
``_kquant_encoders``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ggflow.quant_builtin._kquant_encoders import make_qkx2_quants, round_to_fp16
from ggflow.quant_builtin._kquant_weighted import make_qx_quants_w

f32 = np.float32


@njit(cache=True, fastmath=False)
def _row_sigma2(x):
    s = f32(0.0)
    for j in range(x.size):
        s += x[j] * x[j]
    return s / f32(x.size)


@njit(cache=True, fastmath=False)
def _block_weights(xb, qw, sigma2, weight):
    for j in range(32):
        weight[j] = qw[j] * np.sqrt(sigma2 + xb[j] * xb[j])


@njit(cache=True, fastmath=False)
def _pack_high(L, y, qs_at, qh_at):
    """5-bit levels: low nibbles at y[qs_at:qs_at+16] (j, j+16 per byte), 5th bits as a u32 at y[qh_at]."""
    qh = 0
    for j in range(16):
        xi0 = L[j] & 0xFF
        xi1 = L[j + 16] & 0xFF
        y[qs_at + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4)
        qh |= ((xi0 & 0x10) >> 4) << j
        qh |= ((xi1 & 0x10) >> 4) << (j + 16)
    for k in range(4):
        y[qh_at + k] = (qh >> (8 * k)) & 0xFF


@njit(cache=True, fastmath=False)
def _symmetric(rows, qw, out, nmax, type_size, five_bit):
    weight, L = np.empty(32, np.float32), np.empty(32, np.int8)
    n_rows, n = rows.shape
    for r in range(n_rows):
        x = rows[r]
        sigma2 = _row_sigma2(x)
        for ib in range(n // 32):
            y = out[r, ib * type_size:(ib + 1) * type_size]
            _block_weights(x[32 * ib:32 * ib + 32], qw[r, 32 * ib:32 * ib + 32], sigma2, weight)
            d = make_qx_quants_w(x[32 * ib:32 * ib + 32], nmax, L, weight)
            round_to_fp16(y, 0, d)
            if five_bit:
                _pack_high(L, y, 6, 2)
            else:
                for j in range(16):
                    y[2 + j] = (L[j] | (L[j + 16] << 4)) & 0xFF


@njit(cache=True, fastmath=False)
def _affine(rows, qw, out, nmax, type_size, five_bit):
    weight, L, Laux = np.empty(32, np.float32), np.empty(32, np.uint8), np.empty(32, np.uint8)
    n_rows, n = rows.shape
    for r in range(n_rows):
        x = rows[r]
        sigma2 = _row_sigma2(x)
        for ib in range(n // 32):
            y = out[r, ib * type_size:(ib + 1) * type_size]
            xb = x[32 * ib:32 * ib + 32]
            _block_weights(xb, qw[r, 32 * ib:32 * ib + 32], sigma2, weight)
            d, the_min = make_qkx2_quants(xb, weight, nmax, f32(-0.9), f32(0.05), 36, False, L, Laux)
            round_to_fp16(y, 0, d)
            round_to_fp16(y, 2, -the_min)
            if five_bit:
                _pack_high(L, y, 8, 4)
            else:
                for j in range(16):
                    y[4 + j] = L[j] | (L[j + 16] << 4)


def quantize_q4_0_w(rows, qw, out):
    _symmetric(rows, qw, out, 8, 18, False)


def quantize_q5_0_w(rows, qw, out):
    _symmetric(rows, qw, out, 16, 22, True)


def quantize_q4_1_w(rows, qw, out):
    _affine(rows, qw, out, 15, 20, False)


def quantize_q5_1_w(rows, qw, out):
    _affine(rows, qw, out, 31, 24, True)
