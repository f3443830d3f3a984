"""The op table: for each op the Vulkan backend runs, whether it can run a node and how to launch it.

An op module (ops_*.py) exports ``KERNELS = {Op.NAME: OpKernel(...)}``. ``supports`` looks at types,
shapes and strides only (the scheduler asks before memory is allocated); ``build`` turns a node with
memory into ``Work`` (dispatch.py fits it to the device). A node whose op is absent, or whose
``supports`` says no, runs on another backend (the CPU), so an op is added here only once it is right.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ggflow.backends_builtin.vulkan.buffers import DeviceBuffer
from ggflow.backends_builtin.vulkan.device import Limits, VulkanDevice
from ggflow.backends_builtin.vulkan.dispatch import Operand, Work, resolve, unit_of
from ggflow.backends_builtin.vulkan.pipelines import Pipeline, PipelineCache
from ggflow.core.tensor import Tensor


@dataclass
class BuildContext:
    """What a kernel builder may use: the device, its pipelines, where each tensor lives, scratch memory."""
    device: VulkanDevice
    pipelines: PipelineCache
    substitutes: Mapping[Tensor, Tensor]
    scratch: DeviceBuffer | None = None                        # as large as the split's OpKernel.scratch asks
    state: dict[str, Any] = field(default_factory=dict)        # builders' memo across the nodes of a split

    @property
    def limits(self) -> Limits:
        return self.device.limits

    def operand(self, t: Tensor) -> Operand:
        return resolve(t, self.substitutes)

    def pipeline(self, name: str) -> Pipeline:
        return self.pipelines.get(name)


Supports = Callable[[Tensor, Limits], bool]
Build = Callable[[Tensor, BuildContext], list[Work]]


@dataclass(frozen=True)
class OpKernel:
    supports: Supports
    build: Build
    scratch: Callable[[Tensor], int] | None = None   # bytes of scratch memory a node's kernels need


FLOAT_TYPES = ("F32", "F16")
# Weight types the shaders read (dequant.glsl): get_rows and mul_mat have a variant for each.
WEIGHT_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def float_suffix(t: Tensor) -> str:
    return t.type.name.lower()


def addressable(t: Tensor) -> bool:
    """Offsets and strides a shader can walk: whole units (elements, or 16-bit words of blocks)."""
    unit = unit_of(t.type)
    return all(n >= 0 and n % unit == 0 for n in t.nb) and t.base_offset() % unit == 0


def row_fits(t: Tensor, limits: Limits) -> bool:
    """Kernels split work between rows, never inside one: a row (dim 0) must fit one binding."""
    span = (t.ne[0] // t.type.block_size - 1) * t.nb[0] + t.type.type_size
    return span + limits.min_offset_alignment + 4 <= limits.max_storage_range


def all_kernels() -> dict[str, OpKernel]:
    from ggflow.backends_builtin.vulkan import ops_elementwise, ops_matmul, ops_norm, ops_rope, ops_rows
    table: dict[str, OpKernel] = {}
    for module in (ops_elementwise, ops_norm, ops_rope, ops_rows, ops_matmul):
        table.update(module.KERNELS)
    return table
