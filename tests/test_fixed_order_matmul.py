"""kernels_fixed_order_matmul: the summation order it promises, bit for bit, for every shape of call.

Where a's rows run along kk (K of the cache), each output is summed in the lane order: lane l of LANES
takes kk = l, l + LANES, ... by fma, then a halving tree. The reference below computes that order in
numpy, one lane at a time: a float32 product is exact in float64 and the float64 sum rounded to float32
is the fma's result except in double-rounding ties (about 2**-29 per operation: none in these sizes).
The kernel's 4 x 4 blocks, single rows and columns, and partial last runs must all give those bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.backends_builtin.cpu import kernels_fixed_order_matmul as fixed_order

rng = np.random.default_rng(11)
N_HEAD, N_HEAD_KV = 6, 2


def lane_order_reference(x: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """x (n_head, n, k) float32, keys (n_head_kv, m, k) float32 -> (n_head, n, m), in the lane order."""
    group = x.shape[0] // keys.shape[0]
    a = np.repeat(keys, group, axis=0)[:, None, :, :].astype(np.float64)     # (n_head, 1, m, k)
    xx = x[:, :, None, :].astype(np.float64)                                 # (n_head, n, 1, k)
    lanes = np.zeros(x.shape[:2] + (keys.shape[1], fixed_order.LANES), dtype=np.float32)
    for kk in range(x.shape[-1]):
        lane = kk % fixed_order.LANES
        lanes[..., lane] = (xx[..., kk] * a[..., kk] + lanes[..., lane]).astype(np.float32)
    width = fixed_order.LANES
    while width > 1:                                                          # s_l + s_l+8, + 4, + 2, + 1
        width //= 2
        lanes = lanes[..., :width] + lanes[..., width:2 * width]
    return lanes[..., 0]


def run(keys_memory: np.ndarray, m: int, k: int, x: np.ndarray, parallel: bool = False) -> np.ndarray:
    """K x Q through the kernel, K viewed in a cache laid out as ggml's: [cell][kv head][head_dim]."""
    view = keys_memory[:m].reshape(m, N_HEAD_KV, k).transpose(1, 0, 2)[None]    # (1, n_head_kv, m, k)
    a, steps = fixed_order.as_memory(view)
    assert steps[3] == 1                                                      # rows along kk: the lane order
    xx = np.ascontiguousarray(x[None])
    out = np.empty((1, N_HEAD, x.shape[1], m), dtype=np.float32)
    kernel = fixed_order.mul_mat_fixed_order_parallel if parallel else fixed_order.mul_mat_fixed_order_serial
    kernel(a, view.shape, steps, xx, out, keys_memory.dtype == np.uint16, fixed_order.n_tasks(view.shape, xx.shape))
    return out[0]


@pytest.mark.parametrize("cache_type", ["F16", "F32"])
@pytest.mark.parametrize("k", [64, 37, 80])                  # whole runs of LANES, a partial one, both
def test_rows_along_kk_are_summed_in_the_lane_order_for_every_block_shape(cache_type, k):
    m = 70                                                   # 4-column blocks and 2 single columns
    values = rng.standard_normal((m + 5, N_HEAD_KV * k)).astype(np.float32)
    memory = values.astype(np.float16).view(np.uint16) if cache_type == "F16" else values
    keys = (values.astype(np.float16).astype(np.float32) if cache_type == "F16" else values)[:m]
    keys = keys.reshape(m, N_HEAD_KV, k).transpose(1, 0, 2)
    for n in (1, 2, 7):                                       # 6, 12, 42 rows per KV head: 4-row blocks and rest
        x = rng.standard_normal((N_HEAD, n, k)).astype(np.float32)
        x_used = x.astype(np.float16).astype(np.float32) if cache_type == "F16" else x  # vec_dot_type F16
        np.testing.assert_array_equal(run(memory, m, k, x), lane_order_reference(x_used, keys), err_msg=f"n={n}")


def test_lane_order_is_not_the_sequential_order():
    """The reference must tell orders apart, or the test above would pass for a sequential kernel too."""
    k, m = 64, 70
    values = rng.standard_normal((m, N_HEAD_KV * k)).astype(np.float32)
    keys = values.reshape(m, N_HEAD_KV, k).transpose(1, 0, 2)
    x = rng.standard_normal((N_HEAD, 3, k)).astype(np.float32)
    sequential = np.zeros((N_HEAD, 3, m), dtype=np.float32)
    a = np.repeat(keys, N_HEAD // N_HEAD_KV, axis=0)[:, None].astype(np.float64)
    for kk in range(k):
        sequential = (x[:, :, None, kk].astype(np.float64) * a[..., kk] + sequential).astype(np.float32)
    assert not np.array_equal(sequential, lane_order_reference(x, keys))


def test_serial_and_parallel_drivers_and_any_row_count_give_the_same_bits():
    k, m = 64, 600                                           # two column groups (GROUP_COLS 512)
    memory = rng.standard_normal((m, N_HEAD_KV * k)).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((N_HEAD, 50, k)).astype(np.float32)   # 150 rows per KV head: two row blocks
    serial, parallel = run(memory, m, k, x), run(memory, m, k, x, parallel=True)
    np.testing.assert_array_equal(parallel, serial)
    for t in (0, 3, 49):
        np.testing.assert_array_equal(run(memory, m, k, x[:, t:t + 1]), serial[:, t:t + 1], err_msg=f"row {t}")
