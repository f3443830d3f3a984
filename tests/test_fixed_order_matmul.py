"""products.fixed_order: the summation order it promises, bit for bit, for every shape of call.

Each output is summed by fma from kk = 0 up. The reference below computes that order in numpy: a float32
product is exact in float64 and the float64 sum rounded to float32 is the fma's result except in
double-rounding ties (about 2**-29 per operation: none in these sizes). Where a's rows run along kk (K of
the cache) the kernel transposes a into its tiles in 16 x 16 register blocks, the rest element by
element: whole and partial blocks, tiles and depth blocks must all give those bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu.products import fixed_order

rng = np.random.default_rng(11)
N_HEAD, N_HEAD_KV = 6, 2


def sequential_reference(x: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """x (n_head, n, k) float32, keys (n_head_kv, m, k) float32 -> (n_head, n, m), kk = 0, 1, ... by fma."""
    group = x.shape[0] // keys.shape[0]
    a = np.repeat(keys, group, axis=0)[:, None, :, :].astype(np.float64)     # (n_head, 1, m, k)
    xx = x[:, :, None, :].astype(np.float64)                                 # (n_head, n, 1, k)
    out = np.zeros(x.shape[:2] + keys.shape[1:2], dtype=np.float32)
    for kk in range(x.shape[-1]):
        out = (xx[..., kk] * a[..., kk] + out).astype(np.float32)
    return out


def run(keys_memory: np.ndarray, m: int, k: int, x: np.ndarray, parallel: bool = False) -> np.ndarray:
    """K x Q through the kernel, K viewed in a cache laid out as ggml's: [cell][kv head][head_dim]."""
    view = keys_memory[:m].reshape(m, N_HEAD_KV, k).transpose(1, 0, 2)[None]    # (1, n_head_kv, m, k)
    a, steps = fixed_order.as_memory(view)
    assert steps[3] == 1                                       # rows along kk: the transposed tiles
    xx = np.ascontiguousarray(x[None])
    out = np.empty((1, N_HEAD, x.shape[1], m), dtype=np.float32)
    kernel = fixed_order.mul_mat_fixed_order_parallel if parallel else fixed_order.mul_mat_fixed_order_serial
    kernel(a, view.shape, steps, xx, out, keys_memory.dtype == np.uint16, fixed_order.NO_PAGES, fixed_order.NO_SKIP,
           0, fixed_order.n_tasks(view.shape, xx.shape))
    return out[0]


@pytest.mark.parametrize("cache_type", ["F16", "F32"])
@pytest.mark.parametrize("k", [64, 37, 300])         # whole 16-blocks, a partial one, two depth blocks (256)
def test_keys_along_kk_are_summed_in_order_through_the_block_transpose(cache_type, k):
    m = 70                                           # a whole 64-column tile of 16-blocks, then 6 columns
    values = rng.standard_normal((m + 5, N_HEAD_KV * k)).astype(np.float32)
    memory = values.astype(np.float16).view(np.uint16) if cache_type == "F16" else values
    keys = (values.astype(np.float16).astype(np.float32) if cache_type == "F16" else values)[:m]
    keys = keys.reshape(m, N_HEAD_KV, k).transpose(1, 0, 2)
    for n in (1, 2, 7):                              # 3, 6, 21 rows per KV head: 4-row groups and the rest
        x = rng.standard_normal((N_HEAD, n, k)).astype(np.float32)
        x_used = x.astype(np.float16).astype(np.float32) if cache_type == "F16" else x  # vec_dot_type F16
        np.testing.assert_array_equal(run(memory, m, k, x), sequential_reference(x_used, keys), err_msg=f"n={n}")


def test_serial_and_parallel_drivers_and_any_row_count_give_the_same_bits():
    k, m = 64, 600                                   # two column groups (GROUP_COLS 512)
    memory = rng.standard_normal((m, N_HEAD_KV * k)).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((N_HEAD, 50, k)).astype(np.float32)   # 150 rows per KV head: two row blocks
    serial, parallel = run(memory, m, k, x), run(memory, m, k, x, parallel=True)
    np.testing.assert_array_equal(parallel, serial)
    for t in (0, 3, 49):
        np.testing.assert_array_equal(run(memory, m, k, x[:, t:t + 1]), serial[:, t:t + 1], err_msg=f"row {t}")
