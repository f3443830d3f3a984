"""Group sums of sixteen tokens at once on AMX tiles (Intel's Advanced Matrix Extensions), where the CPU has them.

The byte-quad kernels (``qmm.quads``) form a block's group sums with ``vpdpbusd``: a 16-lane vector of one
token's products at a time. An AMX ``tdpbsud`` multiplies a tile of 16 tokens' signed activation bytes by a
tile of unsigned weight bytes in VNNI order (a row holds four consecutive elements of each of 16 weight rows:
exactly a row of ``decode_quads``' (quads, rows) int32 layout) into 16 x 16 int32 sums: a whole group of 16
tokens and 16 weight rows in one instruction. The sums are the same integers, the type's ``accumulate`` takes
them as from the quads path, so the bits are the same (tests/test_qmm_amx.py).

Linux gives a process AMX's 8 KiB tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); without it the first tile instruction is SIGILL. ``amx_available`` asks once and says
whether the kernels may use the tiles: numba compiles for a CPU with AMX-INT8 (its target machine's features),
the kernel granted the state, and ``GGFLOW_AMX=0`` is not set.

Tiles (palette 1): 0-3 the sums of the 4 runs of 16 rows of a 64-row tile, 4 the tokens' activation bytes of one
group (16 x group bytes), 5-7 the weight quads of one group and 16 rows (group bytes / 4 x 64 bytes), in turn.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

TOKENS = 16          # a tile's rows: the tokens one pass takes
ROWS = 64            # the skeleton's rows per tile (qmm.template.R): four runs of 16
_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def amx_available() -> bool:
    """Whether the kernels may use AMX tiles in this process (the module docstring)."""
    if os.environ.get("GGFLOW_AMX", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    from numba.core.registry import cpu_target
    from ggflow.backends_builtin.cpu.products.qmm.pairs import _target_features
    if not {"+amx-int8", "+amx-tile"} <= _target_features(cpu_target.target_context):
        return False     # what numba compiles for: not the host's where NUMBA_CPU_NAME names another CPU
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


@njit(cache=True, inline="always")
def tile_config(group_bytes):
    """The 64-byte tile configuration (palette 1) for groups of group_bytes activation bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for tile in range(4):                      # sums: 16 tokens x 16 int32
        cfg[16 + 2 * tile] = 64
        cfg[48 + tile] = TOKENS
    cfg[16 + 2 * 4] = group_bytes              # activations: 16 tokens x group_bytes
    cfg[48 + 4] = TOKENS
    for tile in range(5, 8):                   # weight quads: group_bytes / 4 rows of 16 x 4 bytes
        cfg[16 + 2 * tile] = 64
        cfg[48 + tile] = group_bytes // 4
    return cfg


def _declare(builder, name, args):
    return builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ir.VoidType(), args))


@intrinsic
def tiles_start(typingctx, cfg):
    """Load the tile configuration (each thread, before its first tile instruction)."""
    if not (isinstance(cfg, types.Array) and cfg.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        builder.call(_declare(builder, "llvm.x86.ldtilecfg", [i8p]), [builder.bitcast(data, i8p)])
        return context.get_dummy_value()
    return types.none(cfg), codegen


@intrinsic
def tiles_end(typingctx):
    """Release the tile state (the thread's tile registers back to their init state)."""
    def codegen(context, builder, sig, args):
        builder.call(_declare(builder, "llvm.x86.tilerelease", []), [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def group_sums(typingctx, wq, x8, i0, col, j0, part, g):
    """part[u, g, r] = sum over the group's quads j0 .. j0 + group bytes / 4 - 1 and h < 4 of (byte h of wq[j, r])
    * x8[i0 + u, col + 4 (j - j0) + h], for the 16 tokens u and the 64 rows r, unsigned weights by signed
    activations (``tdpbsud``), in the configured tiles (``tile_config``). wq (quads, 64) int32, x8 (n, k) int8 with
    n >= i0 + 16, part (16, groups, 64) int32, all C-contiguous."""
    arrays_ok = all(isinstance(a, types.Array) and a.layout == "C" and a.ndim == nd and a.dtype == dt
                    for a, nd, dt in ((wq, 2, types.int32), (x8, 2, types.int8), (part, 3, types.int32)))
    if not (arrays_ok and all(isinstance(a, types.Integer) for a in (i0, col, j0, g))):
        return None

    def codegen(context, builder, sig, args):
        i8, i64 = ir.IntType(8), ir.IntType(64)
        i8p = i8.as_pointer()
        load = _declare(builder, "llvm.x86.tileloadd64", [i8, i8p, i64])
        store = _declare(builder, "llvm.x86.tilestored64", [i8, i8p, i64])
        zero = _declare(builder, "llvm.x86.tilezero", [i8])
        dot = _declare(builder, "llvm.x86.tdpbsud", [i8, i8, i8])
        wq_a, x8_a, part_a = (context.make_array(sig.args[k])(context, builder, args[k]) for k in (0, 1, 5))
        i0_v, col_v, j0_v, g_v = (context.cast(builder, args[k], sig.args[k], types.int64) for k in (2, 3, 4, 6))
        x_stride = cgutils.unpack_tuple(builder, x8_a.strides, 2)[0]
        wq_stride = cgutils.unpack_tuple(builder, wq_a.strides, 2)[0]
        part_strides = cgutils.unpack_tuple(builder, part_a.strides, 3)
        x_at = builder.add(builder.mul(i0_v, x_stride), builder.add(col_v, builder.mul(j0_v, ir.Constant(i64, 4))))
        builder.call(load, [ir.Constant(i8, 4), builder.gep(builder.bitcast(x8_a.data, i8p), [x_at]), x_stride])
        wq_base = builder.gep(builder.bitcast(wq_a.data, i8p), [builder.mul(j0_v, wq_stride)])
        part_base = builder.gep(builder.bitcast(part_a.data, i8p), [builder.mul(g_v, part_strides[1])])
        subtiles = range(ROWS // 16)
        for s in subtiles:
            builder.call(zero, [ir.Constant(i8, s)])
        for s in subtiles:        # the weights of runs s in tiles 5, 6, 7, 5: a load need not wait for the last dot
            b_tile = ir.Constant(i8, 5 + s % 3)
            builder.call(load, [b_tile, builder.gep(wq_base, [ir.Constant(i64, 64 * s)]), wq_stride])
            builder.call(dot, [ir.Constant(i8, s), ir.Constant(i8, 4), b_tile])
        for s in subtiles:
            at = builder.gep(part_base, [ir.Constant(i64, 64 * s)])
            builder.call(store, [ir.Constant(i8, s), at, part_strides[0]])
        return context.get_dummy_value()
    return types.none(wq, x8, i0, col, j0, part, g), codegen
