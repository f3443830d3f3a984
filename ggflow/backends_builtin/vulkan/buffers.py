"""Device memory: storage buffers the kernels bind, and the host-visible staging that fills them.

A ``DeviceBuffer`` prefers device-local memory. Where that memory is also host-visible (integrated
GPUs, resizable BAR, Mesa's lavapipe) it stays mapped and reads and writes are plain memory copies;
otherwise they go through one staging buffer per device, in chunks, with a copy command each way.
Handles are released by a finalizer when the buffer is collected, never during interpreter shutdown.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ggflow.backends_builtin.vulkan import device as devmod
from ggflow.backends_builtin.vulkan.device import VulkanDevice
from ggflow.core.backend import Buffer
from ggflow.errors import BackendError

STAGING_CHUNK = 64 << 20    # bytes moved per staging round trip


class Allocation:
    """One VkBuffer bound to its own VkDeviceMemory, mapped when the memory type allows."""

    def __init__(self, device: VulkanDevice, size: int, wanted: int, preferred: int, usage: int, map_it: bool):
        vk = device.vk
        self.device, self.size = device, size
        self.buffer = vk.vkCreateBuffer(device.handle, vk.VkBufferCreateInfo(
            size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(device.handle, self.buffer)
        type_index = device.memory_type(req.memoryTypeBits, wanted, preferred)
        try:
            self.memory = vk.vkAllocateMemory(device.handle, vk.VkMemoryAllocateInfo(
                allocationSize=req.size, memoryTypeIndex=type_index), None)
        except Exception as exc:
            vk.vkDestroyBuffer(device.handle, self.buffer, None)
            raise BackendError(f"vulkan: cannot allocate {size} bytes on {device.info.name} "
                               f"({type(exc).__name__})") from None
        vk.vkBindBufferMemory(device.handle, self.buffer, self.memory, 0)
        flags = device.memory_types[type_index]
        host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        self.mapped: np.ndarray | None = None
        self.host_cached = bool(flags & vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
        if map_it and flags & host == host:
            self.mapped = np.frombuffer(vk.vkMapMemory(device.handle, self.memory, 0, size, 0), dtype=np.uint8)
        self._finalizer = weakref.finalize(self, _release, device, self.buffer, self.memory)
        self._finalizer.atexit = False


def _release(device: VulkanDevice, buffer: Any, memory: Any) -> None:
    if devmod.shutting_down():
        return
    vk = device.vk
    with device.lock:
        vk.vkDestroyBuffer(device.handle, buffer, None)
        vk.vkFreeMemory(device.handle, memory, None)


class Staging:
    """The host-visible buffer transfers pass through when device memory is not mapped (or not cached).

    A copy's command buffer is recorded once per (device allocation, direction, offset, size) and
    submitted again for the same transfer: a decode step moves the same inputs and logits every time,
    and recording through the bindings costs more than the copy (an H200: 0.36 ms a staged read against
    0.12 for an empty submit). An entry holds a weak reference to its allocation and is recorded anew
    when that allocation is gone; all are dropped when the staging buffer grows."""

    MAX_RECORDED = 16

    def __init__(self, device: VulkanDevice):
        self.device = device
        self.allocation: Allocation | None = None
        self._recorded: dict[tuple, tuple[weakref.ref, Any, Any]] = {}   # key -> (allocation, cmd, submit)

    def _buffer(self, nbytes: int) -> Allocation:
        vk = self.device.vk
        if self.allocation is None or self.allocation.size < nbytes:
            self._forget_all()
            host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            usage = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
            self.allocation = Allocation(self.device, max(nbytes, 1 << 20), host,
                                         vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, usage, True)
        return self.allocation

    def upload(self, dst: Allocation, offset: int, data: np.ndarray) -> None:
        for start in range(0, data.nbytes, STAGING_CHUNK):
            chunk = data[start:start + STAGING_CHUNK]
            staging = self._buffer(chunk.nbytes)
            staging.mapped[:chunk.nbytes] = chunk  # type: ignore[index]
            self._copy(dst, True, offset + start, chunk.nbytes)

    def download(self, src: Allocation, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, dtype=np.uint8)
        for start in range(0, nbytes, STAGING_CHUNK):
            n = min(STAGING_CHUNK, nbytes - start)
            staging = self._buffer(n)
            self._copy(src, False, offset + start, n)
            out[start:start + n] = staging.mapped[:n]  # type: ignore[index]
        return out

    def _copy(self, device_side: Allocation, to_device: bool, offset: int, nbytes: int) -> None:
        """Copy nbytes between the staging buffer's start and device_side at offset, and wait."""
        key = (id(device_side), to_device, offset, nbytes)
        entry = self._recorded.get(key)
        if entry is None or entry[0]() is not device_side:
            self._forget(key)
            if len(self._recorded) >= self.MAX_RECORDED:
                self._forget(next(iter(self._recorded)))
            entry = self._record(device_side, to_device, offset, nbytes)
            self._recorded[key] = entry
        self.device.submit_and_wait(entry[2])

    def _forget(self, key: tuple) -> None:
        entry = self._recorded.pop(key, None)
        if entry is not None:
            self.device.free_command_buffer(entry[1])

    def _forget_all(self) -> None:
        for key in list(self._recorded):
            self._forget(key)

    def _record(self, device_side: Allocation, to_device: bool, offset: int, nbytes: int) -> tuple:
        vk, staging = self.device.vk, self.allocation
        assert staging is not None
        src, dst = (staging.buffer, device_side.buffer) if to_device else (device_side.buffer, staging.buffer)
        src_offset, dst_offset = (0, offset) if to_device else (offset, 0)
        cmd = self.device.allocate_command_buffer()
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        vk.vkCmdCopyBuffer(cmd, src, dst, 1, [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset,
                                                               size=nbytes)])
        # Make the copy visible to later kernels and to the host (the next submit waits on a fence).
        barrier = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
            | vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT)
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                                vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_HOST_BIT
                                | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                                0, 1, [barrier], 0, None, 0, None)
        vk.vkEndCommandBuffer(cmd)
        return weakref.ref(device_side), cmd, vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])


_staging: dict[int, Staging] = {}


def staging_for(device: VulkanDevice) -> Staging:
    return _staging.setdefault(id(device), Staging(device))


class DeviceBuffer(Buffer):
    """``size`` bytes of device memory that tensors live in; ``write``/``read`` move host data."""

    map_when_possible = True   # tests turn this off to run the staging path on a mapped device

    def __init__(self, device: VulkanDevice, size: int, backend_name: str = "vulkan"):
        if size > device.limits.max_buffer:
            raise BackendError(f"vulkan: a buffer of {size} bytes exceeds {device.info.name}'s limit of "
                               f"{device.limits.max_buffer} bytes per buffer")
        vk = device.vk
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        self.device, self.size, self.backend_name = device, int(size), backend_name
        mappable = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        self.allocation = Allocation(device, max(self.size, 16), vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                     mappable if device.mappable_device_memory else 0, usage,
                                     self.map_when_possible)

    @property
    def handle(self) -> Any:
        return self.allocation.buffer

    @property
    def is_mapped(self) -> bool:
        return self.allocation.mapped is not None

    def _check(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self.size:
            raise BackendError(f"vulkan buffer access [{offset}, {offset + nbytes}) is outside its {self.size} bytes")

    def write(self, offset: int, data: np.ndarray) -> None:
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self._check(offset, flat.nbytes)
        if flat.nbytes == 0:
            return
        with self.device.lock:
            if self.allocation.mapped is not None:
                self.allocation.mapped[offset:offset + flat.nbytes] = flat
            else:
                staging_for(self.device).upload(self.allocation, offset, flat)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        self._check(offset, nbytes)
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8)
        with self.device.lock:
            if self.allocation.mapped is not None and self.allocation.host_cached:
                return self.allocation.mapped[offset:offset + nbytes].copy()
            # Uncached (a discrete GPU's BAR): the host would read it a bus transaction at a time; a copy into
            # cached staging memory is faster.
            return staging_for(self.device).download(self.allocation, offset, nbytes)

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.size} bytes, {'mapped' if self.is_mapped else 'staged'})"
