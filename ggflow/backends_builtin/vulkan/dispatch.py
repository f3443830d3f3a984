"""From a node's tensors to dispatches that fit the device: operands, binding windows, boxes.

A kernel addresses each tensor in "units" (4 bytes for F32/I32, 2 for F16 and for quantized blocks,
which are read as 16-bit words) from the start of its binding. A binding may not span more than
``maxStorageBufferRange`` bytes (128 MiB on many devices) and a dispatch may not launch more than
``maxComputeWorkGroupCount`` groups per dimension (65535 on many). So a node's work is described as a
box over its output's four dims; when a box needs too wide a window on some tensor, or too many
groups, it is halved along a dim that helps, until every piece fits. Each piece is one dispatch whose
bindings are windows around what it touches, and whose push constants say where the box starts and
where each tensor starts inside its window (an offset that may be "negative", wrapping mod 2**32,
since the shaders index with absolute coordinates).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ggflow.backends_builtin.vulkan.buffers import DeviceBuffer
from ggflow.backends_builtin.vulkan.device import Limits
from ggflow.backends_builtin.vulkan.pipelines import Pipeline
from ggflow.core.backend import substituted_memory
from ggflow.core.tensor import Tensor
from ggflow.core.types import TypeTraits
from ggflow.errors import BackendError

Range = tuple[int, int]                 # [lo, hi) along one dim
Box = tuple[Range, Range, Range, Range]
Span = tuple[int, int, int]             # (buffer id, first byte, end byte): memory a binding or operand covers
MASK32 = 0xFFFFFFFF


def spans_overlap(a: Span, b: Span) -> bool:
    """Whether two spans share a byte: the same buffer, byte ranges that intersect."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def unit_of(traits: TypeTraits) -> int:
    """Bytes per shader addressing unit: the element for plain types, a 16-bit word for blocks."""
    return traits.type_size if traits.block_size == 1 else 2


@dataclass(frozen=True)
class Operand:
    """A tensor's memory as a kernel reads it: a device buffer, the byte offset of element 0, the layout."""
    buffer: DeviceBuffer
    offset: int
    type: TypeTraits
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]

    @property
    def unit(self) -> int:
        return unit_of(self.type)

    def strides(self) -> list[int]:
        """nb in units (dim 0 of a blocked type: units per block)."""
        return [n // self.unit for n in self.nb]

    def full(self) -> Box:
        return tuple((0, n) for n in self.ne)  # type: ignore[return-value]

    def span(self, ranges: Box) -> tuple[int, int]:
        """Bytes [start, end) the elements in ranges (per dim of this tensor) can touch."""
        bs = self.type.block_size
        (lo0, hi0), rest = ranges[0], ranges[1:]
        start = self.offset + lo0 // bs * self.nb[0]
        end = self.offset + (hi0 - 1) // bs * self.nb[0] + self.type.type_size
        for (lo, hi), nb in zip(rest, self.nb[1:]):
            start += lo * nb
            end += (hi - 1) * nb
        return start, end


def resolve(t: Tensor, substitutes: Mapping[Tensor, Tensor]) -> Operand:
    """Where a node's source lives for this backend: itself, or the copy made of it (or of what it views)."""
    memory_of, offset = substituted_memory(t, substitutes, "vulkan")
    return _operand(memory_of, t, offset)


def _operand(memory_of: Tensor, shaped_as: Tensor, extra: int) -> Operand:
    base = memory_of.base()
    if not isinstance(base.buffer, DeviceBuffer):
        where = "no memory" if base.buffer is None else f"a {base.buffer.backend_name!r} buffer"
        raise BackendError(f"{shaped_as!r} has {where}; the vulkan backend reads its own device memory only")
    return Operand(base.buffer, base.offset + memory_of.base_offset() + extra, shaped_as.type,
                   shaped_as.ne, shaped_as.nb)


# -- box mappings: which part of a tensor a box of the output touches ------------------------------------
BoxMap = Callable[[Box], Box]


def same(box: Box) -> Box:
    return box


def whole(op: Operand) -> BoxMap:
    full = op.full()
    return lambda box: full


def broadcast_range(r: Range, n: int) -> Range:
    """Indices i % n for i in r: a sub-range when r stays inside one period, else all of [0, n)."""
    lo, hi = r
    if hi - lo >= n or lo // n != (hi - 1) // n:
        return (0, n)
    return (lo % n, (hi - 1) % n + 1)


def repeat_of(ne: Sequence[int]) -> BoxMap:
    """ggml's repeat broadcasting: output index i reads index i % ne in each dim."""
    return lambda box: tuple(broadcast_range(r, n) for r, n in zip(box, ne))  # type: ignore[return-value]


# -- dispatches --------------------------------------------------------------------------------------------
@dataclass
class Dispatch:
    pipeline: Pipeline
    bindings: list[tuple[DeviceBuffer, int, int]]   # (buffer, byte offset, byte range) per binding
    push: bytes
    groups: tuple[int, int, int]


@dataclass
class Work:
    """One node's kernel launch before it is fitted to the device."""
    pipeline: Pipeline
    operands: list[Operand]
    maps: list[BoxMap]                           # per operand: output box -> its ranges
    box: Box                                     # the whole output
    groups: Callable[[Box], tuple[int, int, int]]
    push: Callable[[Box, list[int]], Sequence[int | float | np.floating]]  # (box, unit offsets) -> values
    step: tuple[int, int, int, int] = (0, 1, 1, 1)   # per dim: preferred split granularity, 0 = never


def pack(values: Sequence[int | float | np.floating]) -> bytes:
    """Push constants: Python ints as uint32 (wrapping negatives), floats as float32."""
    out = bytearray()
    for v in values:
        if isinstance(v, (float, np.floating)):
            out += struct.pack("<f", float(v))
        else:
            out += struct.pack("<I", int(v) & MASK32)
    if len(out) > 128:
        raise BackendError(f"vulkan: {len(out)} bytes of push constants exceed 128")
    return bytes(out)


def window(op: Operand, span: tuple[int, int], limits: Limits) -> tuple[int, int]:
    """(byte offset, byte range) of a binding around span, its offset aligned as the device needs."""
    align = max(limits.min_offset_alignment, op.unit)
    start = span[0] - span[0] % align
    end = min(op.buffer.size, -(-span[1] // 4) * 4)
    return start, max(end - start, 4)


def _excess(work: Work, box: Box, limits: Limits) -> float:
    """How far a box is over the device's limits (<= 1: it fits)."""
    worst = 0.0
    for op, m in zip(work.operands, work.maps):
        _, size = window(op, op.span(m(box)), limits)
        worst = max(worst, size / limits.max_storage_range)
    for n, cap in zip(work.groups(box), limits.max_groups):
        worst = max(worst, n / cap)
    return worst


def _halves(box: Box, dim: int, step: int) -> tuple[Box, Box] | None:
    """Split at a multiple of step (a kernel's tile) from the box's start; finer only below one step."""
    lo, hi = box[dim]
    if hi - lo <= 1:
        return None
    mid = lo + -(-((hi - lo) // 2) // step) * step if hi - lo > step else lo + (hi - lo) // 2
    if mid >= hi:
        mid = lo + (hi - lo) // 2
    first, second = list(box), list(box)
    first[dim], second[dim] = (lo, mid), (mid, hi)
    return tuple(first), tuple(second)  # type: ignore[return-value]


def fit(work: Work, limits: Limits) -> list[Dispatch]:
    """Split the work's box until each piece fits the device, and make one dispatch per piece."""
    out: list[Dispatch] = []
    stack = [work.box]
    while stack:
        box = stack.pop()
        if _excess(work, box, limits) > 1.0:
            options = [(d, h) for d in (3, 2, 1, 0) if work.step[d]
                       and (h := _halves(box, d, work.step[d])) is not None]
            if not options:
                raise BackendError(f"vulkan: {work.pipeline.name} cannot be split to fit the device's limits "
                                   f"(a binding over {limits.max_storage_range} bytes)")
            _, halves = min(options, key=lambda o: _excess(work, o[1][0], limits))
            stack += [halves[1], halves[0]]
            continue
        bindings, offsets = [], []
        for op, m in zip(work.operands, work.maps):
            start, size = window(op, op.span(m(box)), limits)
            bindings.append((op.buffer, start, size))
            offsets.append((op.offset - start) // op.unit)
        groups = work.groups(box)
        if min(groups) > 0:
            out.append(Dispatch(work.pipeline, bindings, pack(work.push(box, offsets)), groups))
    return out


def extent(r: Range) -> int:
    return r[1] - r[0]


def row_groups(x: int) -> Callable[[Box], tuple[int, int, int]]:
    """Grid of the row kernels: x groups along a row, one y per row, z over dims 2 x 3 of the box."""
    return lambda box: (x, extent(box[1]), extent(box[2]) * extent(box[3]))


def box_origin(box: Box) -> list[int]:
    """What the row kernels need to place a group: o1, o2, o3 and the box's extent along dim 2."""
    return [box[1][0], box[2][0], box[3][0], extent(box[2])]
