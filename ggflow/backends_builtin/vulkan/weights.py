"""Uploading model weights to the device once, at load.

Weights arrive as views of the GGUF memory map. Those the kernels can read (a type get_rows and mul_mat
have variants for, whole in host memory) are packed into device buffers of at most one allocation each
and re-pointed there, and the file pages they were read from are given back (Buffer.release); the rest
stay on the host, and the scheduler runs their consumers on the CPU.
Weights already in this device's memory (a model adopted by an earlier Context) are left as they are.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from ggflow.backends_builtin.vulkan.buffers import DeviceBuffer
from ggflow.backends_builtin.vulkan.device import VulkanDevice
from ggflow.backends_builtin.vulkan.kernels import WEIGHT_TYPES
from ggflow.core.tensor import Tensor

ALIGNMENT = 256                 # the largest minStorageBufferOffsetAlignment Vulkan allows
BUFFER_BYTES = 1 << 30          # pack weights into buffers of about this size (at most one allocation)
PROGRESS_MIN_BYTES = 64 << 20   # smaller models upload without a progress bar


def adoptable(t: Tensor, device: VulkanDevice) -> bool:
    return (t.type.name in WEIGHT_TYPES and t.view_src is None and t.buffer is not None and t.buffer.is_host
            and t.is_contiguous() and 0 < t.nbytes <= device.limits.max_allocation)


def pack(tensors: Iterable[Tensor], limit: int) -> list[tuple[list[tuple[Tensor, int]], int]]:
    """Group tensors into buffers of at most ``limit`` bytes: [([(tensor, offset)], size)]."""
    groups: list[tuple[list[tuple[Tensor, int]], int]] = []
    members: list[tuple[Tensor, int]] = []
    size = 0
    for t in tensors:
        start = -(-size // ALIGNMENT) * ALIGNMENT
        if members and start + t.nbytes > limit:
            groups.append((members, size))
            members, start = [], 0
        members.append((t, start))
        size = start + t.nbytes
    if members:
        groups.append((members, size))
    return groups


def upload_weights(weights: Mapping[str, Tensor], device: VulkanDevice, backend_name: str) -> int:
    """Move every adoptable weight into device memory; returns the bytes uploaded."""
    chosen = sorted((t for t in weights.values() if adoptable(t, device)), key=lambda t: t.offset)
    total = sum(t.nbytes for t in chosen)
    if not chosen:
        return 0
    limit = min(BUFFER_BYTES, device.limits.max_allocation, device.limits.max_buffer)
    from tqdm import tqdm
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"{backend_name}: uploading weights",
              disable=True if total < PROGRESS_MIN_BYTES else None, leave=False) as progress:
        for members, size in pack(chosen, max(limit, max(t.nbytes for t in chosen))):
            buffer = DeviceBuffer(device, size, backend_name)
            for t, offset in members:
                host = t.buffer.host_array()  # type: ignore[union-attr]
                buffer.write(offset, host[t.offset:t.offset + t.nbytes])
                t.buffer.release(t.offset, t.nbytes)  # type: ignore[union-attr]  (a mapped file's pages go)
                t.buffer, t.offset = buffer, offset
                progress.update(t.nbytes)
    return total
