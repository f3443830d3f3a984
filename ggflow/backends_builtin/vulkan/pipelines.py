"""Compute pipelines made from the shipped SPIR-V, cached per device, and the descriptor sets they bind.

Every shader here binds storage buffers 0..n-1 in set 0 and takes at most 128 bytes of push constants
(the least every Vulkan device offers). The binding count is read from the SPIR-V itself, so adding a
shader is adding its .comp file and compiling it (scripts/compile_shaders.py): no table to update. So are
the bindings a shader may write (those not declared ``readonly``), which plans use to place barriers.
"""
from __future__ import annotations

import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggflow.backends_builtin.vulkan import device as devmod
from ggflow.backends_builtin.vulkan.device import VulkanDevice
from ggflow.errors import BackendError

SHADER_DIR = Path(__file__).resolve().parent / "shaders"
PUSH_CONSTANT_BYTES = 128
SPIRV_MAGIC = 0x07230203
OP_TYPE_STRUCT, OP_TYPE_POINTER, OP_VARIABLE, OP_DECORATE, OP_MEMBER_DECORATE = 30, 32, 59, 71, 72
DECORATION_NON_WRITABLE, DECORATION_BINDING = 24, 33


def spirv_words(path: Path) -> tuple[int, ...]:
    data = path.read_bytes()
    words = struct.unpack(f"<{len(data) // 4}I", data)
    if not words or words[0] != SPIRV_MAGIC:
        raise BackendError(f"{path} is not a SPIR-V module")
    return words


def binding_count(words: tuple[int, ...]) -> int:
    """1 + the highest ``layout(binding = N)`` the module declares."""
    return 1 + max((ops[2] for opcode, ops in instructions(words)
                    if opcode == OP_DECORATE and len(ops) >= 3 and ops[1] == DECORATION_BINDING), default=-1)


def instructions(words: tuple[int, ...]):
    """(opcode, operands) of each instruction after the 5-word header."""
    i = 5
    while i < len(words):
        opcode, length = words[i] & 0xFFFF, words[i] >> 16
        yield opcode, words[i + 1:i + max(length, 1)]
        i += max(length, 1)


def written_bindings(words: tuple[int, ...]) -> frozenset[int]:
    """The bindings the shader may write: all but those whose variable, or every member of whose block,
    is NonWritable (GLSL's ``readonly``)."""
    binding_of, readonly_vars, pointee, block_of = {}, set(), {}, {}
    members: dict[int, int] = {}
    readonly_members: dict[int, set[int]] = {}
    for opcode, ops in instructions(words):
        if opcode == OP_DECORATE and ops[1] == DECORATION_BINDING:
            binding_of[ops[0]] = ops[2]
        elif opcode == OP_DECORATE and ops[1] == DECORATION_NON_WRITABLE:
            readonly_vars.add(ops[0])
        elif opcode == OP_MEMBER_DECORATE and ops[2] == DECORATION_NON_WRITABLE:
            readonly_members.setdefault(ops[0], set()).add(ops[1])
        elif opcode == OP_TYPE_STRUCT:
            members[ops[0]] = len(ops) - 1
        elif opcode == OP_TYPE_POINTER:
            pointee[ops[0]] = ops[2]
        elif opcode == OP_VARIABLE:
            block_of[ops[1]] = pointee.get(ops[0])
    written = set()
    for var, binding in binding_of.items():
        block = block_of.get(var)
        readonly = var in readonly_vars or (block in members and
                                            len(readonly_members.get(block, ())) == members[block])
        if not readonly:
            written.add(binding)
    return frozenset(written)


@dataclass(eq=False)
class Pipeline:
    name: str
    n_bindings: int
    writes: frozenset[int]   # bindings the shader may write
    handle: Any
    layout: Any
    set_layout: Any


class PipelineCache:
    """name -> Pipeline for one device, created on first use (a driver compiles each once)."""

    def __init__(self, device: VulkanDevice):
        self.device = device
        self._pipelines: dict[str, Pipeline] = {}

    def get(self, name: str) -> Pipeline:
        pipeline = self._pipelines.get(name)
        if pipeline is None:
            with self.device.lock:
                pipeline = self._pipelines[name] = self._create(name)
        return pipeline

    def __contains__(self, name: str) -> bool:
        return (SHADER_DIR / f"{name}.spv").is_file()

    def _create(self, name: str) -> Pipeline:
        vk, dev = self.device.vk, self.device.handle
        path = SHADER_DIR / f"{name}.spv"
        if not path.is_file():
            raise BackendError(f"vulkan: shader {name!r} is missing ({path}); run scripts/compile_shaders.py")
        code = path.read_bytes()
        words = spirv_words(path)
        n_bindings = binding_count(words)
        module = vk.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(n_bindings)]
        set_layout = vk.vkCreateDescriptorSetLayout(dev, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=n_bindings, pBindings=bindings), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=PUSH_CONSTANT_BYTES)
        layout = vk.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[set_layout], pushConstantRangeCount=1, pPushConstantRanges=[push]), None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
        handle = vk.vkCreateComputePipelines(dev, None, 1, [vk.VkComputePipelineCreateInfo(
            stage=stage, layout=layout)], None)[0]
        vk.vkDestroyShaderModule(dev, module, None)
        return Pipeline(name, n_bindings, written_bindings(words), handle, layout, set_layout)


_caches: dict[int, PipelineCache] = {}


def pipelines_for(device: VulkanDevice) -> PipelineCache:
    return _caches.setdefault(id(device), PipelineCache(device))


class DescriptorSets:
    """A pool holding one descriptor set per dispatch of a plan, freed with the plan."""

    def __init__(self, device: VulkanDevice, layouts: list[Any], n_descriptors: int):
        vk = device.vk
        self.device = device
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       descriptorCount=max(1, n_descriptors))
        self.pool = vk.vkCreateDescriptorPool(device.handle, vk.VkDescriptorPoolCreateInfo(
            maxSets=max(1, len(layouts)), poolSizeCount=1, pPoolSizes=[size]), None)
        self.sets: list[Any] = []
        if layouts:
            allocated = vk.vkAllocateDescriptorSets(device.handle, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.pool, descriptorSetCount=len(layouts), pSetLayouts=layouts))
            self.sets = [allocated[i] for i in range(len(layouts))]
        self._finalizer = weakref.finalize(self, _destroy_pool, device, self.pool)
        self._finalizer.atexit = False

    def write(self, index: int, bindings: list[tuple[Any, int, int]]) -> None:
        """Point set ``index`` at (VkBuffer, offset, range) per binding."""
        vk = self.device.vk
        infos = [vk.VkDescriptorBufferInfo(buffer=buf, offset=offset, range=size) for buf, offset, size in bindings]
        writes = [vk.VkWriteDescriptorSet(dstSet=self.sets[index], dstBinding=i, descriptorCount=1,
                                          descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info])
                  for i, info in enumerate(infos)]
        vk.vkUpdateDescriptorSets(self.device.handle, len(writes), writes, 0, None)


def _destroy_pool(device: VulkanDevice, pool: Any) -> None:
    if not devmod.shutting_down():
        with device.lock:
            device.vk.vkDestroyDescriptorPool(device.handle, pool, None)
