"""Graph allocator: places intermediate tensors in shared buffers by liveness.

Like ggml-alloc's dynamic allocator: walk the execution order; before step i allocate the tensors it
defines, after step i free the tensors whose last reader was step i. Freed ranges are reused (best fit,
neighbours merged), so a deep model's compute memory is about the peak of one layer, not the sum of
all layers. The walk runs over offsets only; buffers are created once at the end at the peak size.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Hashable, Iterable

from ggflow.core.tensor import Tensor

NEVER = sys.maxsize  # end step of a tensor that must outlive the graph (outputs, inputs)


@dataclass
class Lifetime:
    tensor: Tensor
    pool: Hashable       # which address space (one per backend)
    start: int           # step that writes it first
    end: int             # last step that reads it (NEVER: keep to the end)


class OffsetAllocator:
    """Best-fit allocation of byte ranges in one growing address space."""

    def __init__(self, alignment: int):
        self.alignment = alignment
        self.free_blocks: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.high_water = 0                            # end of the address space used so far

    def _aligned(self, size: int) -> int:
        return max(self.alignment, -(-size // self.alignment) * self.alignment)

    def alloc(self, size: int) -> int:
        size = self._aligned(size)
        best = None
        for i, (offs, bsize) in enumerate(self.free_blocks):
            if bsize >= size and (best is None or bsize < self.free_blocks[best][1]):
                best = i
        if best is not None:
            offs, bsize = self.free_blocks[best]
            if bsize == size:
                del self.free_blocks[best]
            else:
                self.free_blocks[best] = (offs + size, bsize - size)
            return offs
        # No free range fits: take one at the top, absorbing a free range that ends there.
        if self.free_blocks and sum(self.free_blocks[-1]) == self.high_water:
            offs, _ = self.free_blocks.pop()
        else:
            offs = self.high_water
        self.high_water = offs + size
        return offs

    def free(self, offset: int, size: int) -> None:
        size = self._aligned(size)
        blocks = self.free_blocks
        blocks.append((offset, size))
        blocks.sort()
        merged: list[tuple[int, int]] = []
        for offs, bsize in blocks:
            if merged and sum(merged[-1]) == offs:
                merged[-1] = (merged[-1][0], merged[-1][1] + bsize)
            else:
                merged.append((offs, bsize))
        self.free_blocks = merged


def plan_offsets(lifetimes: Iterable[Lifetime], alignment: dict[Hashable, int]
                 ) -> tuple[dict[int, tuple[Hashable, int]], dict[Hashable, int]]:
    """Give every tensor an offset in its pool. Returns ({tensor id: (pool, offset)}, {pool: size})."""
    lifetimes = list(lifetimes)
    allocators = {pool: OffsetAllocator(align) for pool, align in alignment.items()}
    starts: dict[int, list[Lifetime]] = {}
    ends: dict[int, list[Lifetime]] = {}
    for lt in lifetimes:
        starts.setdefault(lt.start, []).append(lt)
        if lt.end != NEVER:
            ends.setdefault(lt.end, []).append(lt)
    placed: dict[int, tuple[Hashable, int]] = {}
    for step in sorted(set(starts) | set(ends)):
        for lt in starts.get(step, ()):      # outputs of this step first: they may not overlap its inputs
            placed[lt.tensor.id] = (lt.pool, allocators[lt.pool].alloc(lt.tensor.nbytes))
        for lt in ends.get(step, ()):
            pool, offs = placed[lt.tensor.id]
            allocators[pool].free(offs, lt.tensor.nbytes)
    return placed, {pool: a.high_water for pool, a in allocators.items()}
