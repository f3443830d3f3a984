"""The int16-pair multiply-accumulate of the batched matmul (qmm.pairs.pair_sums) against numpy."""
import numpy as np
import pytest
from numba import njit

from ggflow.backends_builtin.cpu.products.qmm.pairs import pair_sums

ROWS = 64


@njit(cache=True)
def _run(wp, xq, i0, o, npairs, part, groups, ntok):
    for g in range(groups):
        if ntok == 4:
            pair_sums(wp, xq, i0, 4, o, g * npairs, npairs, part, g, ROWS)
        else:
            pair_sums(wp, xq, i0, 1, o, g * npairs, npairs, part, g, ROWS)


def _expected(wd, xq, i0, o, gsize, ntok):
    groups = wd.shape[0] // gsize
    out = np.empty((ntok, groups, ROWS), np.int64)
    for u in range(ntok):
        x = xq[i0 + u, o:o + wd.shape[0]].astype(np.int64)
        prod = wd.astype(np.int64) * x[:, None]
        out[u] = prod.reshape(groups, gsize, ROWS).sum(axis=1)
    return out.astype(np.int16)   # the int16 sums the matvec path forms: the exact sum mod 2**16


@pytest.mark.parametrize("ntok", [1, 4])
@pytest.mark.parametrize("gsize, lim", [(2, 128), (8, 32), (16, 16), (16, 2000)])   # the last overflows int16
def test_pair_sums_match_numpy(ntok, gsize, lim):
    rng = np.random.default_rng(gsize * 10 + ntok)
    qk, n, o, i0 = 32, 7, 32, 2
    wd = rng.integers(-lim, lim, (qk, ROWS)).astype(np.int16)          # a decoded block (elements, rows)
    xq = rng.integers(-127, 128, (n, 3 * qk)).astype(np.int16)
    wp = np.empty((qk // 2, 2 * ROWS), np.int16)                        # pairs of a row side by side
    wp[:, 0::2] = wd[0::2]
    wp[:, 1::2] = wd[1::2]
    part = np.full((ntok, qk // gsize, ROWS), 12345, np.int16)
    _run(wp, xq, i0, o, gsize // 2, part, qk // gsize, ntok)
    np.testing.assert_array_equal(part, _expected(wd, xq, i0, o, gsize, ntok))
