"""The Vulkan instance, the physical device it runs on, and one logical device with a compute queue.

Device choice: ``GGFLOW_VULKAN_DEVICE=N`` picks the N-th physical device as the driver lists them;
otherwise a discrete GPU, then an integrated one, then a virtual one, then a CPU driver (Mesa's
lavapipe). One ``VulkanDevice`` is made per process and shared by every VulkanBackend: buffers of one
backend instance can then be read by another (a model's weights outlive a Context).

Nothing here runs at import: the ``vulkan`` package (cffi bindings) is imported on first use, and
every way it can be missing (no package, no libvulkan, no driver, no device, a device without the
features the shaders need) becomes a ``VulkanUnavailable`` with a sentence saying which.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from ggflow.errors import BackendError

ENV_DEVICE = "GGFLOW_VULKAN_DEVICE"
API_VERSION = (1, 2, 0)
MIN_WORKGROUP_INVOCATIONS = 256       # the tiled matmul runs 16 x 16 threads

# Physical device types in the order they are preferred (Vulkan's enum values).
TYPE_NAMES = {1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu", 0: "other"}
PREFERENCE = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


class VulkanUnavailable(Exception):
    """Why this process cannot run Vulkan compute (the message is shown to users)."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    kind: str            # discrete, integrated, virtual, cpu, other

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("discrete", "integrated", "virtual")


@dataclass(frozen=True)
class Limits:
    """What the kernels must fit in; tests shrink these to exercise the splitting paths."""
    max_storage_range: int           # bytes one storage-buffer binding may span
    min_offset_alignment: int        # a binding's offset must be a multiple of this
    max_groups: tuple[int, int, int]  # workgroups per dispatch dimension
    max_allocation: int              # bytes one VkDeviceMemory may hold
    max_buffer: int                  # bytes one VkBuffer may span
    subgroup_size: int


def import_vulkan() -> ModuleType:
    try:
        import vulkan  # noqa: PLC0415  (optional dependency)
    except ImportError:
        raise VulkanUnavailable("the 'vulkan' package is not installed (pip install 'ggflow[vulkan]')") from None
    except OSError as exc:  # the bindings load libvulkan at import
        raise VulkanUnavailable(f"the Vulkan loader (libvulkan) is missing: {exc}; install libvulkan1 "
                                "and a driver (mesa-vulkan-drivers for the CPU driver)") from None
    return vulkan


def create_instance(vk: ModuleType) -> Any:
    app = vk.VkApplicationInfo(pApplicationName="ggflow", applicationVersion=1, pEngineName="ggflow",
                               engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(*API_VERSION))
    try:
        return vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    except Exception as exc:  # VkErrorIncompatibleDriver when no ICD is installed
        raise VulkanUnavailable(f"no Vulkan driver could create an instance ({type(exc).__name__}); "
                                "install a driver (mesa-vulkan-drivers for the CPU driver)") from None


def describe(vk: ModuleType, index: int, physical: Any) -> DeviceInfo:
    props = vk.vkGetPhysicalDeviceProperties(physical)
    return DeviceInfo(index, str(props.deviceName), TYPE_NAMES.get(int(props.deviceType), "other"))


def choose(infos: list[DeviceInfo], env: str | None) -> DeviceInfo:
    if not infos:
        raise VulkanUnavailable("the Vulkan driver reports no physical device")
    if env not in (None, ""):
        try:
            index = int(env)  # type: ignore[arg-type]
        except ValueError:
            raise VulkanUnavailable(f"{ENV_DEVICE}={env!r} is not a device index") from None
        if not 0 <= index < len(infos):
            listed = ", ".join(f"{i.index}: {i.name}" for i in infos)
            raise VulkanUnavailable(f"{ENV_DEVICE}={index} but the devices are {listed}")
        return infos[index]
    return min(infos, key=lambda i: (PREFERENCE[i.kind], i.index))


DEVICE_LOCAL, HOST_VISIBLE, HOST_COHERENT, HOST_CACHED = 0x1, 0x2, 0x4, 0x8   # VkMemoryPropertyFlagBits


def all_device_memory_mappable(types: list[tuple[int, int]], heap_sizes: list[int]) -> bool:
    """Whether a device-local, host-visible, coherent memory type lives on the largest device-local heap:
    resizable BAR on a discrete GPU (an H200's is its whole 140 GB), or a unified-memory device. Then
    every buffer can be mapped, and the host writes inputs in place instead of through a staging copy (a
    submit and a wait each). Without resizable BAR such a type sits on a separate 256 MiB heap, too small
    to hold a model's buffers, and is left alone."""
    local = [heap for flags, heap in types if flags & DEVICE_LOCAL]
    if not local:
        return False
    largest = max(local, key=lambda heap: heap_sizes[heap])
    mappable = DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT
    return any(flags & mappable == mappable and heap == largest for flags, heap in types)


class VulkanDevice:
    """A logical device with one compute queue, a command pool and a fence. Thread-safe submits."""

    def __init__(self, vk: ModuleType, instance: Any, physical: Any, info: DeviceInfo):
        self.vk, self.instance, self.physical, self.info = vk, instance, physical, info
        self._check_features()
        self.limits = self._read_limits()
        self.queue_family = self._compute_queue_family()
        self.handle = self._create_device()
        self.queue = vk.vkGetDeviceQueue(self.handle, self.queue_family, 0)
        self.command_pool = vk.vkCreateCommandPool(self.handle, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family), None)
        self.fence = vk.vkCreateFence(self.handle, vk.VkFenceCreateInfo(), None)
        self.memory_types, self.mappable_device_memory = self._memory_types()
        self.lock = threading.RLock()
        self._fence_array = vk.ffi.new("VkFence[1]", [self.fence])

    # -- setup -----------------------------------------------------------------------------------
    def _check_features(self) -> None:
        vk = self.vk
        f12 = vk.VkPhysicalDeviceVulkan12Features()
        f11 = vk.VkPhysicalDeviceVulkan11Features(pNext=f12)
        f2 = vk.VkPhysicalDeviceFeatures2(pNext=f11)
        vk.vkGetPhysicalDeviceFeatures2(self.physical, f2)
        needed = {"storageBuffer16BitAccess": f11.storageBuffer16BitAccess,
                  "storageBuffer8BitAccess": f12.storageBuffer8BitAccess,
                  "shaderFloat16": f12.shaderFloat16, "shaderInt8": f12.shaderInt8}
        missing = [name for name, have in needed.items() if not have]
        if missing:
            raise VulkanUnavailable(f"{self.info.name} lacks the Vulkan features {', '.join(missing)}")

    def _read_limits(self) -> Limits:
        vk = self.vk
        p11 = vk.VkPhysicalDeviceVulkan11Properties()
        p2 = vk.VkPhysicalDeviceProperties2(pNext=p11)
        vk.vkGetPhysicalDeviceProperties2(self.physical, p2)
        lim = p2.properties.limits
        subgroup_ops = vk.VK_SUBGROUP_FEATURE_BASIC_BIT | vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT
        if p11.subgroupSupportedOperations & subgroup_ops != subgroup_ops \
                or not p11.subgroupSupportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT:
            raise VulkanUnavailable(f"{self.info.name} lacks subgroup arithmetic in compute shaders")
        if lim.maxComputeWorkGroupInvocations < MIN_WORKGROUP_INVOCATIONS:
            raise VulkanUnavailable(f"{self.info.name} runs at most {lim.maxComputeWorkGroupInvocations} "
                                    f"threads per workgroup; the kernels need {MIN_WORKGROUP_INVOCATIONS}")
        m3 = vk.VkPhysicalDeviceMaintenance3Properties()
        vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=m3))
        return Limits(
            max_storage_range=int(lim.maxStorageBufferRange),
            min_offset_alignment=max(4, int(lim.minStorageBufferOffsetAlignment)),
            max_groups=tuple(int(n) for n in lim.maxComputeWorkGroupCount),  # type: ignore[arg-type]
            max_allocation=int(m3.maxMemoryAllocationSize) or (1 << 30),
            max_buffer=min(int(m3.maxMemoryAllocationSize) or (1 << 30), 1 << 32),
            subgroup_size=int(p11.subgroupSize) or 32,
        )

    def _compute_queue_family(self) -> int:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        for i, fam in enumerate(families):
            if fam.queueFlags & vk.VK_QUEUE_COMPUTE_BIT and fam.queueCount > 0:
                return i
        raise VulkanUnavailable(f"{self.info.name} has no compute queue")

    def _create_device(self) -> Any:
        vk = self.vk
        f12 = vk.VkPhysicalDeviceVulkan12Features(storageBuffer8BitAccess=1, shaderFloat16=1, shaderInt8=1)
        f11 = vk.VkPhysicalDeviceVulkan11Features(pNext=f12, storageBuffer16BitAccess=1)
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1,
                                           pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(pNext=f11, queueCreateInfoCount=1, pQueueCreateInfos=[queue])
        try:
            return vk.vkCreateDevice(self.physical, info, None)
        except Exception as exc:
            raise VulkanUnavailable(f"{self.info.name}: creating the device failed ({type(exc).__name__})") from None

    def _memory_types(self) -> tuple[list[int], bool]:
        """Each memory type's flags, and whether all of the device's memory can be mapped (see below)."""
        props = self.vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        types = [(int(props.memoryTypes[i].propertyFlags), int(props.memoryTypes[i].heapIndex))
                 for i in range(props.memoryTypeCount)]
        heaps = [int(props.memoryHeaps[i].size) for i in range(props.memoryHeapCount)]
        return [flags for flags, _ in types], all_device_memory_mappable(types, heaps)

    def memory_type(self, allowed_bits: int, wanted: int, preferred: int = 0) -> int:
        """Index of a memory type allowed by ``allowed_bits`` with all ``wanted`` flags (and, if one
        exists, the ``preferred`` ones too). Vulkan lists faster types first, so the first match wins."""
        candidates = [i for i, flags in enumerate(self.memory_types)
                      if allowed_bits & (1 << i) and flags & wanted == wanted]
        if not candidates:
            raise MemoryError(f"{self.info.name} has no memory type with flags {wanted:#x}")
        best = [i for i in candidates if self.memory_types[i] & preferred == preferred]
        return (best or candidates)[0]

    # -- command submission --------------------------------------------------------------------------
    def submit_and_wait(self, submit_info: Any) -> None:
        """Run a prepared VkSubmitInfo and wait for it (every compute here is synchronous)."""
        vk = self.vk
        with self.lock:
            try:
                vk.vkQueueSubmit(self.queue, 1, submit_info, self.fence)
                vk.vkWaitForFences(self.handle, 1, self._fence_array, vk.VK_TRUE, 0xFFFFFFFFFFFFFFFF)
                vk.vkResetFences(self.handle, 1, self._fence_array)
            except vk.VkError as exc:   # device lost, out of memory: the driver's word, as a ggflow error
                raise BackendError(f"vulkan: running commands on {self.info.name} failed: "
                                   f"{type(exc).__name__}") from exc

    def allocate_command_buffer(self) -> Any:
        vk = self.vk
        return vk.vkAllocateCommandBuffers(self.handle, vk.VkCommandBufferAllocateInfo(
            commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]

    def free_command_buffer(self, cmd: Any) -> None:
        if not _shutting_down:
            with self.lock:
                self.vk.vkFreeCommandBuffers(self.handle, self.command_pool, 1, [cmd])

    def run_once(self, record: Callable[[Any], None]) -> None:
        """Record commands into a fresh command buffer, run them and wait."""
        vk = self.vk
        with self.lock:
            cmd = self.allocate_command_buffer()
            try:
                vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                record(cmd)
                vk.vkEndCommandBuffer(cmd)
                self.submit_and_wait(vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd]))
            finally:
                vk.vkFreeCommandBuffers(self.handle, self.command_pool, 1, [cmd])

    def __repr__(self) -> str:
        return f"VulkanDevice({self.info.index}: {self.info.name}, {self.info.kind})"


# -- the process-wide device -------------------------------------------------------------------------
_lock = threading.Lock()
_device: VulkanDevice | None = None
_failure: str | None = None
_shutting_down = False


def list_devices() -> list[DeviceInfo]:
    """Every physical device the driver reports (raises VulkanUnavailable without Vulkan)."""
    vk = import_vulkan()
    instance = create_instance(vk)
    try:
        return [describe(vk, i, pd) for i, pd in enumerate(vk.vkEnumeratePhysicalDevices(instance))]
    finally:
        vk.vkDestroyInstance(instance, None)


def get_device() -> VulkanDevice:
    """The device this process computes on, made on first call; VulkanUnavailable says why not."""
    global _device, _failure
    with _lock:
        if _device is not None:
            return _device
        if _failure is not None:
            raise VulkanUnavailable(_failure)
        try:
            vk = import_vulkan()
            instance = create_instance(vk)
            physicals = list(vk.vkEnumeratePhysicalDevices(instance))
            info = choose([describe(vk, i, pd) for i, pd in enumerate(physicals)], os.environ.get(ENV_DEVICE))
            _device = VulkanDevice(vk, instance, physicals[info.index], info)
        except VulkanUnavailable as exc:
            _failure = str(exc)
            raise
        import atexit
        atexit.register(_at_exit)
        return _device


def device_if_available() -> VulkanDevice | None:
    try:
        return get_device()
    except VulkanUnavailable:
        return None


def _at_exit() -> None:
    # Let queued work finish, then stop releasing handles: objects collected during interpreter
    # shutdown would call into a half-torn-down cffi module. The driver frees everything at exit.
    global _shutting_down
    if _device is not None:
        try:
            _device.vk.vkDeviceWaitIdle(_device.handle)
        except Exception:
            pass
    _shutting_down = True


def shutting_down() -> bool:
    return _shutting_down
