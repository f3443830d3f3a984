"""The Vulkan backend as a plugin: availability and its reasons, device choice, priority and backend="auto",
device buffers, weight upload, what it refuses (so the scheduler runs it on the CPU), the shipped shaders."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from ggflow.backends_builtin.vulkan import backend as backend_mod
from ggflow.backends_builtin.vulkan import device as device_mod
from ggflow.backends_builtin.vulkan import weights as weights_mod
from ggflow.backends_builtin.vulkan.backend import CPU_DRIVER_PRIORITY, GPU_PRIORITY, VulkanBackend
from ggflow.backends_builtin.vulkan.device import DeviceInfo, VulkanUnavailable, choose
from ggflow.backends_builtin.vulkan.pipelines import SHADER_DIR, binding_count, spirv_words
from ggflow.core import ops
from ggflow.core.backend import HostBuffer
from ggflow.core.backend_registry import make_backends
from ggflow.core.quants import quantize
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.errors import BackendError
from ggflow.plugins.manager import get_plugin_manager
from tests.vulkan_harness import on_vulkan_and_cpu, requires_vulkan, vulkan

ROOT = Path(__file__).resolve().parents[1]


# -- without a device (these run everywhere) -------------------------------------------------------------
def test_the_backend_is_registered_even_where_it_cannot_run():
    assert get_plugin_manager().backends.get("vulkan") is VulkanBackend


def test_a_missing_vulkan_package_is_a_reason_not_an_exception(monkeypatch):
    monkeypatch.setitem(sys.modules, "vulkan", None)   # import vulkan -> ImportError
    with pytest.raises(VulkanUnavailable, match="'vulkan' package is not installed"):
        device_mod.import_vulkan()


def test_is_available_never_raises(monkeypatch):
    def broken():
        raise RuntimeError("driver exploded")
    monkeypatch.setattr(backend_mod, "get_device", broken)
    availability = VulkanBackend.is_available()
    assert not availability and "RuntimeError: driver exploded" in availability.reason


def test_an_unavailable_backend_says_why_when_asked_for_by_name(monkeypatch):
    def unavailable():
        raise VulkanUnavailable("the Vulkan driver reports no physical device")
    monkeypatch.setattr(backend_mod, "get_device", unavailable)
    with pytest.raises(BackendError, match="vulkan.*no physical device"):
        make_backends(["vulkan"])


INFOS = [DeviceInfo(0, "llvmpipe", "cpu"), DeviceInfo(1, "Some iGPU", "integrated"), DeviceInfo(2, "Big GPU", "discrete")]


def test_a_discrete_gpu_is_chosen_first_then_integrated_then_cpu_drivers():
    assert choose(INFOS, None).name == "Big GPU"
    assert choose(INFOS[:2], None).name == "Some iGPU"
    assert choose(INFOS[:1], "").name == "llvmpipe"


def test_the_environment_picks_a_device_by_index():
    assert choose(INFOS, "0").name == "llvmpipe"
    with pytest.raises(VulkanUnavailable, match="GGFLOW_VULKAN_DEVICE=5 but the devices are 0: llvmpipe"):
        choose(INFOS, "5")
    with pytest.raises(VulkanUnavailable, match="not a device index"):
        choose(INFOS, "gpu")


@pytest.mark.parametrize("kind, priority", [("discrete", GPU_PRIORITY), ("integrated", GPU_PRIORITY),
                                            ("cpu", CPU_DRIVER_PRIORITY)])
def test_priority_is_above_the_cpu_only_on_a_gpu(monkeypatch, kind, priority):
    class FakeDevice:
        info = DeviceInfo(0, "x", kind)
    monkeypatch.setattr(backend_mod, "get_device", lambda: FakeDevice())
    monkeypatch.setattr(backend_mod, "pipelines_for", lambda device: None)
    assert VulkanBackend().priority == priority


# memory types (flags, heap) and heap sizes as drivers report them
H200 = ([(0x0, 1), (0x1, 0), (0x6, 1), (0xE, 1), (0x7, 0)], [143771 << 20, 96651 << 20])   # NVIDIA, resizable BAR
BAR_256M = ([(0x0, 1), (0x1, 0), (0x6, 1), (0xE, 1), (0x7, 2)], [24 << 30, 64 << 30, 256 << 20])
LAVAPIPE = ([(0xF, 0)], [2 << 30])


@pytest.mark.parametrize("table, mappable", [(H200, True), (BAR_256M, False), (LAVAPIPE, True),
                                             (([(0x6, 0)], [8 << 30]), False)])
def test_device_memory_is_mapped_only_where_all_of_it_can_be(table, mappable):
    assert device_mod.all_device_memory_mappable(*table) is mappable


def test_weights_are_packed_into_buffers_of_bounded_size():
    tensors = [Tensor("F32", (n,)) for n in (100, 30, 64, 10)]
    groups = weights_mod.pack(tensors, limit=512)
    assert [[t.nbytes for t, _ in members] for members, _ in groups] == [[400], [120, 256], [40]]
    for members, size in groups:
        assert all(offset % weights_mod.ALIGNMENT == 0 for _, offset in members)
        assert size == members[-1][1] + members[-1][0].nbytes


def test_every_shader_variant_is_compiled_and_shipped():
    spec = importlib.util.spec_from_file_location("compile_shaders", ROOT / "scripts" / "compile_shaders.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # type: ignore[union-attr]
    names = set(script.variants())
    shipped = {p.stem for p in SHADER_DIR.glob("*.spv")}
    assert names == shipped
    for name in names:
        assert binding_count(spirv_words(SHADER_DIR / f"{name}.spv")) >= 2


# -- with a device -----------------------------------------------------------------------------------------
@requires_vulkan
def test_auto_uses_vulkan_only_on_a_gpu():
    names = [b.name for b in make_backends("auto")]
    assert names[-1] == "cpu"
    assert ("vulkan" in names) == vulkan().device.info.is_gpu
    assert [b.name for b in make_backends(["vulkan"])] == ["vulkan", "cpu"]


@requires_vulkan
def test_device_buffers_round_trip_and_refuse_out_of_range_access():
    buf = vulkan().alloc_buffer(1000)
    data = np.arange(250, dtype=np.float32)
    buf.write(0, data)
    assert (buf.read(0, 1000).view(np.float32) == data).all()
    with pytest.raises(BackendError, match="outside its 1000 bytes"):
        buf.write(990, data[:4])
    with pytest.raises(BackendError, match="outside"):
        buf.read(-4, 8)


@requires_vulkan
def test_set_and_get_tensor_handle_views():
    backend = vulkan()
    t = Tensor("F32", (6, 4))
    t.buffer, t.offset = backend.alloc_buffer(t.nbytes + 256), 256
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    backend.set_tensor(t, values)
    assert (backend.get_tensor(t) == values).all()
    assert (backend.get_tensor(ops.transpose(t)) == values.T).all()


@requires_vulkan
def test_adopted_weights_move_to_the_device_and_unsupported_types_stay_on_the_host():
    data = {"q": quantize(np.ones((4, 64), np.float32), "Q8_0"), "f": np.ones((4, 64), np.float32),
            "bf": np.ones((4, 64), np.uint16)}
    weights = {}
    for name, (type_name, array) in {"q": ("Q8_0", data["q"]), "f": ("F32", data["f"]),
                                     "bf": ("BF16", data["bf"])}.items():
        t = Tensor(type_name, (64, 4), name=name, flags=TensorFlag.PARAM)
        t.buffer, t.offset = HostBuffer(np.ascontiguousarray(array).view(np.uint8).reshape(-1).copy()), 0
        weights[name] = t
    before = {n: t.buffer.host_array().copy() for n, t in weights.items()}
    vulkan().adopt_weights(weights)
    assert weights["q"].buffer.backend_name == weights["f"].buffer.backend_name == "vulkan"
    assert weights["bf"].buffer.is_host
    for name in ("q", "f"):
        assert (vulkan().get_tensor(weights[name]).reshape(-1).view(np.uint8) == before[name]).all()


@requires_vulkan
def test_ops_it_cannot_run_go_to_the_cpu():
    """A BF16 weight (no shader reads it) and a dequantizing copy are refused; the scheduler moves them.
    (silu comes first: after a matmul on the CPU, the scheduler would run it there too, as ggml does.)"""
    def build():
        w, x = ops.new_input("BF16", (32, 8), "w"), ops.new_input("F32", (32, 3), "x")
        q, f = ops.new_input("Q8_0", (32, 2), "q"), ops.new_input("F32", (32, 2), "f")
        return {"w": w, "x": x, "q": q, "f": f}, [ops.mul_mat(w, ops.silu(x)), ops.cpy(q, f)]
    bf16 = (np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32).view(np.uint32) >> 16)
    inputs = {"w": bf16.astype(np.uint16), "x": np.ones((3, 32), np.float32),
              "q": quantize(np.ones((2, 32), np.float32), "Q8_0"), "f": np.zeros((2, 32), np.float32)}
    vk, cpu = on_vulkan_and_cpu(build, inputs)
    assert set(vk.ops_on("cpu")) == {"mul_mat", "cpy"} and "silu" in vk.ops_on("vulkan")
    for got, want in zip(vk.outputs, cpu.outputs):
        np.testing.assert_allclose(got, want, rtol=1e-6)
