"""VulkanBackend: runs graph nodes as Vulkan compute shaders on a GPU (or on Mesa's lavapipe).

compile() turns a split's nodes into dispatches once (kernels.py, dispatch.py; chains of them into one,
fusion.py) and records them into a command buffer (plan.py); every reuse of the graph replays it with one
submit. Ops, types or layouts the shaders don't cover are refused in supports_op, so the scheduler runs
those nodes on the CPU.

Priority (per instance, from the device found): a real GPU outranks the CPU backend; a CPU driver
(lavapipe) gets a negative priority, which backend="auto" skips, since it is slower than the CPU
backend. It still runs when asked for by name.
"""
from __future__ import annotations

from typing import ClassVar, Mapping, Sequence

from ggflow.backends_builtin.vulkan.buffers import DeviceBuffer
from ggflow.backends_builtin.vulkan.device import VulkanDevice, VulkanUnavailable, get_device
from ggflow.backends_builtin.vulkan.dispatch import fit
from ggflow.backends_builtin.vulkan.fusion import fused_works
from ggflow.backends_builtin.vulkan.kernels import BuildContext, OpKernel, addressable, all_kernels, row_fits
from ggflow.backends_builtin.vulkan.pipelines import pipelines_for
from ggflow.backends_builtin.vulkan.plan import VulkanPlan
from ggflow.core.backend import Availability, Backend, BackendOptions
from ggflow.core.ops import PURE_VIEWS
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError

GPU_PRIORITY = 100
CPU_DRIVER_PRIORITY = -1


def device_priority(device: VulkanDevice) -> int:
    """Above the CPU backend on a GPU; below it (left out by backend="auto") on a CPU driver."""
    return GPU_PRIORITY if device.info.is_gpu else CPU_DRIVER_PRIORITY


class VulkanBackend(Backend):
    name: ClassVar[str] = "vulkan"
    alignment: ClassVar[int] = 256   # the largest minStorageBufferOffsetAlignment Vulkan allows
    description: ClassVar[str] = "Vulkan compute shaders (GPUs; Mesa's lavapipe on CPUs)"
    priority: int = GPU_PRIORITY     # an instance on a CPU driver lowers its own (device_priority)
    fuse: bool = True                # run fusion.py's chains as one dispatch (tests and benchmarks turn it off)

    def __init__(self, options: BackendOptions = BackendOptions()) -> None:
        super().__init__(options)
        try:
            self.device: VulkanDevice = get_device()
        except VulkanUnavailable as exc:
            raise BackendError(f"the vulkan backend is not available: {exc}") from None
        self.priority = device_priority(self.device)
        self.pipelines = pipelines_for(self.device)
        self.kernels: dict[str, OpKernel] = all_kernels()
        self._scratch: DeviceBuffer | None = None

    @classmethod
    def is_available(cls) -> Availability:
        try:
            device = get_device()
        except VulkanUnavailable as exc:
            return Availability(False, str(exc))
        except Exception as exc:  # a broken driver must not take the plugin listing down with it
            return Availability(False, f"probing Vulkan failed: {type(exc).__name__}: {exc}")
        return Availability(True, f"{device.info.name} ({device.info.kind})", device_priority(device))

    # -- memory ----------------------------------------------------------------------------------------
    def alloc_buffer(self, size: int) -> DeviceBuffer:
        return DeviceBuffer(self.device, size, self.name)

    def adopt_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Upload the weights the kernels read to device memory, once (see weights.py)."""
        from ggflow.backends_builtin.vulkan.weights import upload_weights
        upload_weights(weights, self.device, self.name)

    # -- ops -------------------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        if node.op in PURE_VIEWS or node.nelements == 0:
            return True
        kernel = self.kernels.get(node.op)
        limits = self.device.limits
        if kernel is None or not all(addressable(t) and row_fits(t, limits) for t in (node, *node.src)):
            return False
        return kernel.supports(node, limits)

    def compile(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None) -> VulkanPlan:
        runnable = [n for n in nodes if n.op not in PURE_VIEWS and n.nelements > 0]
        for node in runnable:
            if not self.supports_op(node):
                raise BackendError(f"the vulkan backend cannot run {node!r} (op {node.op!r}, "
                                   f"types {[s.type.name for s in node.src]} -> {node.type.name})")
        ctx = BuildContext(self.device, self.pipelines, substitutes or {}, scratch=self._scratch_for(runnable))
        works, i = [], 0
        while i < len(runnable):
            fused = fused_works(runnable, i, ctx) if self.fuse else None
            if fused is None:
                fused = self.kernels[runnable[i].op].build(runnable[i], ctx), 1
            works += fused[0]
            i += fused[1]
        dispatches = [d for w in works for d in fit(w, self.device.limits)]
        return VulkanPlan(self.device, dispatches, keep_alive=[ctx.scratch] if ctx.scratch else [])

    def _scratch_for(self, nodes: Sequence[Tensor]) -> DeviceBuffer | None:
        """One scratch buffer for every plan of this backend: plans run one at a time, and a kernel's
        scratch is written and read within the plan's own submission."""
        need = max((k.scratch(n) for n in nodes if (k := self.kernels[n.op]).scratch), default=0)
        if need and (self._scratch is None or self._scratch.size < need):
            self._scratch = DeviceBuffer(self.device, need, self.name)
        return self._scratch if need else None

    def compute(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None) -> None:
        self.compile(nodes, substitutes)()

    def __repr__(self) -> str:
        return f"VulkanBackend({self.device.info.name})"
