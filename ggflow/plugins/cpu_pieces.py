"""What a quantized type hands the CPU backend to get a packed, vectorised matmul: its pieces.

Every quantized type, built-in or a plugin's, runs in one skeleton (``qmm.template``): the weight is
repacked once into row tiles (``TILE`` rows side by side, see ``qmm.layout``), activations are quantized
to the type's ``vec_dot_type`` (Q8_0, Q8_1 or Q8_K, split into int16 values ``xq``, a scale per block
``dx`` and the per-block extra ``xe``: int32 block sums for Q8_0, f32 d*sum for Q8_1, int32 sums of 16 for
Q8_K), and the skeleton calls the type's pieces for each block ``b`` of each tile ``t``:

    pack(w_bytes (rows, row_bytes) uint8, rows, k) -> tuple of arrays, each (n_tiles, ..., TILE)
    block_sums(w, t, b, xq, i, o, part)   one-pass matvec of token i (its block starts at element o):
                                          part[g, r] = int16 sum of products of group g, rows r < TILE
    decode(w, t, b, wd)                   batches: block b of tile t as int16 values, wd (block_size, TILE)
    accumulate(acc, part, w, t, b, dx, xe, i)   acc[r] += the f32 contribution of part (one token's row)
    decode_quads(w, t, b, wq)             optional: block b of tile t as byte quads, wq (block_size // 4,
                                          TILE) int32, lane wq[j, r] = elements 4j .. 4j+3 of row r as
                                          unsigned bytes, each value + quad_bias (signed types: Q6_K's 32);
                                          half a group's products (value + bias) * 128 must fit int16 (on
                                          AVX2; bias 128, a whole signed byte as Q8_0's, takes the quads
                                          only where they add in 32 bits: AVX512-VNNI, not AVX2)
    block_quads(w, t, b, x8, xs, i, ntok, o, part)   optional, with decode_quads: the quads' int32 sums of
                                          tokens i .. i+ntok-1 (ntok a literal) read straight from the packed
                                          words (``qmm.quads.word_quad_sums``), part (ntok, groups, TILE);
                                          products of up to BLOCK_QUADS_MAX_TOKENS tokens take it instead of
                                          decode_quads + quad_sums
    accumulate_block_quads(acc, part, w, t, b, dx, xe, i)   optional, with block_quads: the accumulate of what
                                          block_quads left where it folds the type's integer scales in as it
                                          goes (a run of groups' scaled sum in the run's first slot: the
                                          K-quants' ``_fold_scales``), so that a block ends in a short
                                          accumulate: a long one is a stretch with no load of the weight in
                                          the instruction window, which a one-token product streaming from
                                          memory pays for (Q4_K 1.2x)

``w`` is the tuple ``pack`` returned. Groups are consecutive runs of ``block_size // groups`` elements
whose products fit int16 (|q * x| summed over the group below 2**15); for batches the skeleton forms
the same group sums from ``decode``'s values, or, where the type brings ``decode_quads``, from byte dot
products (``qmm.quads``: vpmaddubsw, vpdpbusd) into an int32 ``part``: ``accumulate`` reads the same
integers either way (through ``np.int32(part[g, r])``). The functions are numba njit functions, best with
``inline="always"``: the skeleton inlines them and LLVM vectorises the row loops (``for r in range(TILE)``,
one activation broadcast into TILE rows). ``field``, ``bit_to`` and ``sext8`` cut bit fields in 16-bit
lanes; ``wide_vectors`` is called by the skeleton; ``prefetch_slice`` asks for a later block's bytes ahead
(``BlockPieces.prefetch_bytes`` does it once a block for small blocks; ``qmm.prefetch``).
``examples/ggflow-example-plugin`` (IQ4_NL) is a complete plugin type written this way; docs/plugins.md
explains the seam.

A type with no pieces still runs: the CPU backend converts its weight once, when it packs it, to F16
(2 bytes per weight; F32 if that is the type's vec_dot_type) and uses that type's kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ggflow.backends_builtin.cpu.products.qmm.int16 import bit_to, field, half_word, sext8, wide_vectors, word_pair
from ggflow.backends_builtin.cpu.products.qmm.layout import TILE, f16_field, tile_rows
from ggflow.backends_builtin.cpu.products.qmm.prefetch import prefetch_slice
from ggflow.backends_builtin.cpu.products.qmm.quads import BIT_MASK, SIGNED_BYTES, word_quad_sums


@dataclass(frozen=True)
class BlockPieces:
    """A quantized type's pieces for the CPU matmul skeleton (see the module docstring)."""
    block_size: int          # elements per block the skeleton steps over (the type's block size)
    groups: int              # int16 partial sums per block; an even number dividing block_size
    pack: Callable[[np.ndarray, int, int], tuple]
    block_sums: Callable
    decode: Callable
    accumulate: Callable
    decode_quads: Callable | None = None   # optional: batches in byte quads (vpdpbusd), see below
    quad_bias: int = 0       # what decode_quads adds to each value to make it an unsigned byte (Q6_K: 32)
    quads_from: int = 3      # products of this many tokens or more take the quads kernel (measured per type)
    quad_groups: int = 0     # the groups the quads kernel sums apart (0: groups); fewer where a group is
                             # under a quad or one sum a scale or a block will do (Q8_0: int16 pairs in
                             # block_sums, one int32 sum a block in the quads; the K-quants: one a scale)
    accumulate_quads: Callable | None = None   # accumulate for the quads' quad_groups sums (None: accumulate,
                                               # reading groups - quad_groups zeros)
    block_quads: Callable | None = None   # optional: the quads' sums straight from the packed words, no decoded
                                          # block (needs decode_quads, which larger batches still take)
    accumulate_block_quads: Callable | None = None   # optional: the accumulate after block_quads where it folds
                                                     # the scales in (None: the quads' accumulate); where the
                                                     # quads add in int16 pairs and quad_groups_int32 is set,
                                                     # block_quads must not fold (the skeleton calls accumulate)
    quad_groups_int32: bool = False   # quad_groups only where the quads add in int32 (AVX512-VNNI, plain IR):
                                      # on AVX2 their int16 pair sums hold half a quad group, and half of these
                                      # bigger groups' products may not fit (Q5_K, Q6_K), so there the quads sum
                                      # the type's groups apart and ``accumulate`` reads them
    prefetch_bytes: int = 0  # a matvec asks for the weight's bytes this far ahead of the block it reads
                             # (qmm.prefetch; 0: none from the skeleton: the hardware prefetchers, or the
                             # pieces ask themselves, as the K-quants do; measured per type)

    def __post_init__(self):
        if self.groups < 2 or self.groups % 2 or self.block_size % self.groups:
            raise ValueError(f"BlockPieces: groups={self.groups} must be even and divide block_size={self.block_size}")
        if self.quad_groups and (self.quad_groups > self.groups or self.block_size % self.quad_groups):
            raise ValueError(f"BlockPieces: quad_groups={self.quad_groups} must divide block_size="
                             f"{self.block_size} and be at most groups={self.groups}")
        if self.decode_quads is not None and (self.block_size // self.quad_group_count) % 4:
            raise ValueError(f"BlockPieces: decode_quads needs groups of a multiple of 4 elements, got "
                             f"{self.block_size // self.quad_group_count}")
        if self.accumulate_block_quads is not None and self.block_quads is None:
            raise ValueError("BlockPieces: accumulate_block_quads needs block_quads (it reads what that left)")
        if self.block_quads is not None and self.decode_quads is None:
            raise ValueError("BlockPieces: block_quads needs decode_quads (batches past BLOCK_QUADS_MAX_TOKENS take it)")
        if self.quads_from < 1:
            raise ValueError(f"BlockPieces: quads_from={self.quads_from} must be at least 1 token")
        if self.quad_groups_int32 and (not self.quad_groups or (self.block_size // self.groups) % 4):
            raise ValueError("BlockPieces: quad_groups_int32 needs quad_groups, and groups of a multiple of 4 "
                             "elements for the quads to fall back on")
        if self.prefetch_bytes < 0:
            raise ValueError(f"BlockPieces: prefetch_bytes={self.prefetch_bytes} must be 0 (none) or more")
        if not 0 <= self.quad_bias <= 128:
            raise ValueError(f"BlockPieces: quad_bias={self.quad_bias} must be in [0, 128]")

    @property
    def quad_group_count(self) -> int:
        return self.quad_groups or self.groups

    def functions(self) -> tuple[Callable, ...]:
        extra = tuple(f for f in (self.decode_quads, self.accumulate_quads, self.block_quads,
                                  self.accumulate_block_quads) if f is not None)
        return (self.pack, self.block_sums, self.decode, self.accumulate) + extra


__all__ = ["BlockPieces", "TILE", "tile_rows", "f16_field", "field", "bit_to", "sext8", "wide_vectors", "word_pair",
           "half_word", "word_quad_sums", "SIGNED_BYTES", "BIT_MASK",
           "prefetch_slice"]
