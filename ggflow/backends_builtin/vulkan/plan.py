"""A compiled split: its dispatches recorded once into a command buffer, replayed on every call.

Dispatches run in graph order. A memory barrier goes before a dispatch only where it touches memory that
a dispatch since the last barrier wrote, or writes memory one since then read (barriers_needed), so a GPU
may run independent kernels side by side. In a decode step few are independent (the allocator reuses
memory between consecutive nodes): 61 of a SmolLM2 step's 814 barriers go, no measurable gain on an
H200. The last barrier makes the results visible to the host and to transfer copies. Calling the plan
submits the command buffer and waits for it, so the scheduler can read outputs right after. The plan
keeps the buffers it binds alive: a buffer released while a recorded command still points at it would
be a use-after-free on the device.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

from ggflow.backends_builtin.vulkan import device as devmod
from ggflow.backends_builtin.vulkan.device import VulkanDevice
from ggflow.backends_builtin.vulkan.dispatch import Dispatch, spans_overlap
from ggflow.backends_builtin.vulkan.pipelines import PUSH_CONSTANT_BYTES, DescriptorSets


def barriers_needed(dispatches: Sequence[Dispatch]) -> list[bool]:
    """For each dispatch, whether a barrier must go before it: it reads or writes a span written since the
    last barrier (read after write, write after write), or writes one read since then (write after read).
    A binding's span is the window bound, at least what the kernel touches, so this errs towards a
    barrier; the bindings a shader writes come from its SPIR-V (Pipeline.writes)."""
    needed, written, read = [], [], []
    for d in dispatches:
        spans = [(id(buf), offset, offset + size) for buf, offset, size in d.bindings]
        writes = [spans[i] for i in d.pipeline.writes if i < len(spans)]
        hazard = (any(spans_overlap(s, w) for s in spans for w in written)
                  or any(spans_overlap(w, r) for w in writes for r in read))
        needed.append(hazard)
        if hazard:
            written, read = [], []
        written += writes
        read += spans
    return needed


class VulkanPlan:
    elide_barriers = True   # False: a barrier before every dispatch (benchmarks compare the two)

    def __init__(self, device: VulkanDevice, dispatches: Sequence[Dispatch], keep_alive: Sequence[Any] = ()):
        self.device = device
        self.dispatches = list(dispatches)
        self.keep_alive = list(keep_alive) + list({id(b[0]): b[0] for d in self.dispatches for b in d.bindings}
                                                  .values())
        self.command_buffer = None
        self.submit_info = None
        self.n_barriers = 0
        if self.dispatches:
            self._record()

    def __len__(self) -> int:
        return len(self.dispatches)

    def _record(self) -> None:
        vk, dev = self.device.vk, self.device
        with dev.lock:
            self.descriptors = DescriptorSets(dev, [d.pipeline.set_layout for d in self.dispatches],
                                              sum(len(d.bindings) for d in self.dispatches))
            for i, d in enumerate(self.dispatches):
                self.descriptors.write(i, [(buf.handle, offset, size) for buf, offset, size in d.bindings])
            cmd = dev.allocate_command_buffer()
            self.command_buffer = cmd
            self._finalizer = weakref.finalize(self, _free_command_buffer, dev, cmd)
            self._finalizer.atexit = False
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
            between = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                         dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
            compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
            needed = barriers_needed(self.dispatches) if self.elide_barriers else [True] * len(self.dispatches)
            self.n_barriers = sum(needed[1:])
            for i in range(len(self.dispatches)):
                if i and needed[i]:
                    vk.vkCmdPipelineBarrier(cmd, compute, compute, 0, 1, [between], 0, None, 0, None)
                self.record_dispatch(cmd, i)
            done = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                      dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
                                      | vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
            vk.vkCmdPipelineBarrier(cmd, compute, vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
                                    | compute, 0, 1, [done], 0, None, 0, None)
            vk.vkEndCommandBuffer(cmd)
            self.submit_info = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])

    def record_dispatch(self, cmd: Any, i: int) -> None:
        """Dispatch i into cmd: its pipeline, descriptor set and push constants, then the dispatch itself."""
        vk, d = self.device.vk, self.dispatches[i]
        bind_point = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        vk.vkCmdBindPipeline(cmd, bind_point, d.pipeline.handle)
        vk.vkCmdBindDescriptorSets(cmd, bind_point, d.pipeline.layout, 0, 1, [self.descriptors.sets[i]], 0, None)
        push = d.push.ljust(PUSH_CONSTANT_BYTES, b"\0")
        vk.vkCmdPushConstants(cmd, d.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push),
                              vk.ffi.new("char[]", push))
        vk.vkCmdDispatch(cmd, *d.groups)

    def __call__(self) -> None:
        if self.submit_info is not None:
            self.device.submit_and_wait(self.submit_info)


def _free_command_buffer(device: VulkanDevice, cmd: Any) -> None:
    if not devmod.shutting_down():
        device.free_command_buffer(cmd)
