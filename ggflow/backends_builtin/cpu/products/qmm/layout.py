"""The repacked weight layout shared by the quantized kernels: rows interleaved in tiles.

A weight of ``rows`` x ``k`` is cut into tiles of ``TILE`` rows (the last one zero-padded). Inside
a tile every per-row field of a block (a quant byte, a scale) is stored for the ``TILE`` rows next
to each other, so the kernels' innermost loop runs across rows: one activation value is broadcast
and multiplied into ``TILE`` rows at once, with no horizontal sums. That loop is what LLVM turns
into 16-bit SIMD multiply-adds.
"""
from __future__ import annotations

import numpy as np

# Rows per tile. The kernel modules compile it in as a constant, and numba's on-disk cache only
# notices edits to a kernel's own file: change it here and the kernels keep their cached copies
# with the old tile. Each kernel module therefore states the tile it was written for and checks
# it against this one at import (see check_tile).
TILE = 64


def check_tile(module_tile: int, module: str) -> None:
    if module_tile != TILE:
        raise ImportError(f"{module} is compiled for {module_tile}-row tiles but qmm.layout.TILE is {TILE}: "
                          f"change both (and numba's cache of {module} is then rebuilt)")


def n_tiles(rows: int) -> int:
    return -(-rows // TILE)


def tile_rows(a: np.ndarray) -> np.ndarray:
    """(rows, *fields) -> (n_tiles, *fields, TILE), rows zero-padded up to a whole tile."""
    rows = a.shape[0]
    nt = n_tiles(rows)
    if nt * TILE != rows:
        pad = np.zeros((nt * TILE - rows,) + a.shape[1:], a.dtype)
        a = np.concatenate([a, pad])
    a = a.reshape((nt, TILE) + a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def f16_bits(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 at byte ``offset`` of each block, kept as its 16 bits (uint16): the kernels widen it with
    ``qmm.floats.f16_bits_to_f32`` (vcvtph2ps), and the packed weight is no bigger than the file's blocks."""
    return np.ascontiguousarray(blocks[..., offset:offset + 2]).view(np.uint16)[..., 0]


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 at byte ``offset`` of each block, as float32. blocks: (rows, nb, type_size) uint8."""
    return np.ascontiguousarray(blocks[..., offset:offset + 2]).view(np.float16)[..., 0].astype(np.float32)
