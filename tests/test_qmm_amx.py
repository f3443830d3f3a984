"""Products on AMX tiles (qmm.amx, the skeleton's "amx" path): the group sums against numpy, every product bit
for bit against the matvec's, and the path taken only where it may run. The tile tests need a CPU with AMX-INT8
whose kernel grants the tile state; elsewhere they skip, saying so."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import ggflow
from ggflow.backends_builtin.cpu.products.qmm import amx as _qmm_amx
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
from ggflow.core.types import type_traits

HAVE_AMX = _qmm_amx.amx_available()
needs_amx = pytest.mark.skipif(not HAVE_AMX, reason="this CPU has no AMX-INT8 tiles (or Linux did not grant their "
                                                    "state): the amx path is not taken here")
AMX_TYPES = [t for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
             if tmpl.amx_takes(qmm.cpu_pieces(type_traits(t)))]


def test_the_types_with_up_to_8_quad_groups_a_block_take_the_tiles():
    assert AMX_TYPES == ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"]


def test_ggflow_amx_0_turns_the_tiles_off(monkeypatch):
    monkeypatch.setenv("GGFLOW_AMX", "0")
    assert _qmm_amx.amx_available.__wrapped__() is False


def test_the_amx_driver_is_refused_where_the_tiles_are_not_available(monkeypatch):
    """Without the tile state the first tile instruction would kill the process (SIGILL): the entry point
    refuses, and batch_path never names the path."""
    monkeypatch.setattr(_qmm_amx, "amx_available", lambda: False)
    pw = qmm.pack_weight(ggflow.quantize(np.ones((64, 256), np.float32), "Q4_0"), "Q4_0")
    assert tmpl.batch_path(pw.kind, 64) != "amx"
    with pytest.raises(RuntimeError, match="AMX tiles"):
        tmpl.entry_point(pw.kind, False, (), "amx")


@njit
def _group_sums(wq, x8, i0, col, j0, groups, group_bytes):
    part = np.full((16, groups, 64), 12345, np.int32)
    _qmm_amx.tiles_start(_qmm_amx.tile_config(group_bytes))
    for g in range(groups):
        _qmm_amx.group_sums(wq, x8, i0, col, j0 + g * group_bytes // 4, part, g)
    _qmm_amx.tiles_end()
    return part


@needs_amx
@pytest.mark.parametrize("group_bytes", [32, 64])
def test_group_sums_are_unsigned_weight_bytes_times_signed_activations(group_bytes):
    rng = np.random.default_rng(group_bytes)
    groups, i0, col, j0 = 2, 3, 64, 4
    k = col + 4 * j0 + groups * group_bytes + 16
    wbytes = rng.integers(0, 256, (k // 4, 4, 64)).astype(np.uint8)     # [quad, h, row]
    wbytes[:, :, 0] = 255                                                # a row of the largest bytes ...
    x8 = rng.integers(-128, 128, (i0 + 16, k)).astype(np.int8)
    x8[i0, :] = -128                                                     # ... against the most negative
    wq = np.ascontiguousarray(wbytes.transpose(0, 2, 1)).view(np.int32)[..., 0]   # (quads, rows) of four bytes
    part = _group_sums(wq, x8, i0, col, j0, groups, group_bytes)
    w = wbytes.transpose(0, 1, 2).reshape(k, 64).astype(np.int64)       # element 4j + h of each row
    for g in range(groups):
        e0 = 4 * j0 + g * group_bytes
        want = x8[i0:i0 + 16, col + e0:col + e0 + group_bytes].astype(np.int64) @ w[e0:e0 + group_bytes]
        np.testing.assert_array_equal(part[:, g], want)


@needs_amx
@pytest.mark.parametrize("n", [1, 16, 23, 64, 65])
@pytest.mark.parametrize("w_type", AMX_TYPES)
def test_the_tiles_give_the_matvec_results_bit_for_bit(w_type, n):
    """Serial and parallel, whole and partial passes of 16 tokens (n = 1: a pass of padding but one token)."""
    k = 2 * type_traits(w_type).block_size if type_traits(w_type).block_size == 256 else 320
    rng = np.random.default_rng(n)
    pw = qmm.pack_weight(ggflow.quantize(rng.standard_normal((130, k)).astype(np.float32), w_type), w_type)
    x = rng.standard_normal((n, k)).astype(np.float32)
    args = (pw.kind, pw.arrays, *qmm.quantize_activations(x, pw.vec_dot_type))
    one_by_one = np.empty((n, pw.rows), np.float32)
    for i in range(n):
        pw.drivers.get(False)(pw.kind, pw.arrays, *(a[i:i + 1] for a in args[2:]), one_by_one[i:i + 1])
    for parallel in (False, True):
        out = np.full((n, pw.rows), np.nan, np.float32)
        pw.drivers.get(parallel, "amx")(*args, out)
        np.testing.assert_array_equal(out.view(np.uint32), one_by_one.view(np.uint32))


@needs_amx
def test_products_of_16_tokens_or_more_take_the_tiles():
    pw = qmm.pack_weight(ggflow.quantize(np.ones((64, 256), np.float32), "Q4_0"), "Q4_0")
    assert [tmpl.batch_path(pw.kind, n) for n in (1, 15, 16, 64, 512)] == ["quads", "quads", "amx", "amx", "amx"]
    q6 = qmm.pack_weight(ggflow.quantize(np.ones((64, 256), np.float32), "Q6_K"), "Q6_K")
    assert tmpl.batch_path(q6.kind, 64) != "amx"
