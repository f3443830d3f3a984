"""GPU time of each dispatch of compiled Vulkan plans, by timestamp queries (for the benchmarks).

Timing a plan from the host counts its submit and fence wait (0.1-0.15 ms on an H200, longer than a
matrix-vector product there). Here the plans' dispatches are recorded again, each after a barrier as the
plan records it (VulkanPlan.record_dispatch) and followed by a timestamp once it is done; a dispatch's time
is the difference from the timestamp before it (its kernel and the barrier's drain), the median over repeats.
"""
from __future__ import annotations

import numpy as np

from ggflow.backends_builtin.vulkan.device import VulkanDevice


def gpu_seconds_per_dispatch(device: VulkanDevice, plans, repeats: int = 5) -> list[tuple[object, float]]:
    """(dispatch, seconds) for every dispatch of the plans, in order."""
    vk = device.vk
    tick = float(vk.vkGetPhysicalDeviceProperties(device.physical).limits.timestampPeriod) * 1e-9
    dispatches = [(p, i, d) for p in plans for i, d in enumerate(p.dispatches)]
    n = len(dispatches) + 1
    pool = vk.vkCreateQueryPool(device.handle, vk.VkQueryPoolCreateInfo(
        queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=n), None)
    compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
    between = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                 dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)

    def record(cmd) -> None:
        vk.vkCmdResetQueryPool(cmd, pool, 0, n)
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 0)
        for q, (p, i, _) in enumerate(dispatches, 1):
            vk.vkCmdPipelineBarrier(cmd, compute, compute, 0, 1, [between], 0, None, 0, None)
            p.record_dispatch(cmd, i)
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, q)

    runs = []
    try:
        for _ in range(repeats):
            device.run_once(record)
            data = vk.ffi.new("uint64_t[]", n)
            vk.vkGetQueryPoolResults(device.handle, pool, 0, n, 8 * n, data, 8,
                                     vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            runs.append(np.diff(np.frombuffer(vk.ffi.buffer(data), np.uint64).astype(np.float64) * tick))
    finally:
        vk.vkDestroyQueryPool(device.handle, pool, None)
    per_dispatch = np.median(np.array(runs), axis=0)
    return [(d, float(seconds)) for (_, _, d), seconds in zip(dispatches, per_dispatch)]
