"""mul_mat on Vulkan against the CPU backend: every weight type, decode and batch shapes, attention over
an F16 KV cache (permuted views, GQA), and products split to fit a device's binding and group limits.

Weights are model weights (PARAM leaves), which the CPU multiplies with its packed kernels, ggml's
numerics. Both round the activations to the weight's vec_dot_type (F16, Q8_0, Q8_1, Q8_K) before the dot
(and both use Q8_1's per-block sum for Q4_1/Q5_1 minimums); what remains is F32 summation order, so
results agree to 2e-6 of the largest output (here, with k = 512: about 30 float32 ulps of a typical
output; the tests assert 1e-5).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ggflow.backends_builtin.vulkan import ops_matmul
from ggflow.backends_builtin.vulkan.buffers import DeviceBuffer, Staging, staging_for
from ggflow.core import ops
from ggflow.core.quants import dequantize, quantize
from tests.vulkan_harness import assert_close, on_vulkan_and_cpu, requires_vulkan, vulkan, weight

pytestmark = requires_vulkan

REL = 1e-5
WEIGHT_TYPES = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
rng = np.random.default_rng(11)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def weight_data(type_name: str, rows: int, k: int) -> np.ndarray:
    w = randn(rows, k)
    return w if type_name in ("F32", "F16") else quantize(w, type_name)


def check(build, inputs, rel: float = REL) -> None:
    vk, cpu = on_vulkan_and_cpu(build, inputs)
    assert vk.ops_on("cpu") == [], f"ran on the cpu: {vk.ops_on('cpu')}"
    for got, want in zip(vk.outputs, cpu.outputs):
        assert_close(got, want, rel)


@pytest.mark.parametrize("n", [1, 3, 70], ids=["decode", "few", "tiled"])
@pytest.mark.parametrize("type_name", WEIGHT_TYPES)
def test_mul_mat_of_every_weight_type(type_name, n):
    k, m = 512, 80
    w_data = weight_data(type_name, m, k)

    def build():
        x = ops.new_input("F32", (k, n), "x")
        return {"x": x}, [ops.mul_mat(weight(type_name, w_data), x)]
    check(build, {"x": randn(n, k)})


@pytest.mark.parametrize("n", [1, 70], ids=["decode", "tiled"])
def test_f16_weights_round_activations_ahead_with_the_same_bits(n, monkeypatch):
    """A model's F16 weights take b rounded once by round_act_f16, not once per row: the same products."""
    k, m = 512, 80
    w_data, x = weight_data("F16", m, k), randn(n, k) * 3

    def build():
        xs = ops.new_input("F32", (k, n), "x")
        return {"x": xs}, [ops.mul_mat(weight("F16", w_data), xs)]
    ahead, cpu = on_vulkan_and_cpu(build, {"x": x})
    names = [d.pipeline.name for s in ahead.scheduler.splits if s.backend.name == "vulkan" for d in s.plan.dispatches]
    assert names[0] == "round_act_f16" and names[1].endswith("_f16_prerounded")
    monkeypatch.setattr(ops_matmul, "PREROUND_F16_WEIGHTS", False)
    inline, _ = on_vulkan_and_cpu(build, {"x": x})
    np.testing.assert_array_equal(ahead.outputs[0].view(np.uint32), inline.outputs[0].view(np.uint32))
    assert_close(ahead.outputs[0], cpu.outputs[0], REL)


@pytest.mark.parametrize("n_tokens", [1, 9])
def test_attention_over_an_f16_cache_with_gqa(n_tokens):
    """kq = K^T q and kqv = V kq over permuted views of F16 caches, 4 query heads on 2 K/V heads."""
    hd, n_head, n_head_kv, n_kv = 64, 4, 2, 100

    def build():
        k_cache = ops.new_input("F16", (hd * n_head_kv, n_kv), "k_cache")
        v_cache = ops.new_input("F16", (hd * n_head_kv, n_kv), "v_cache")
        q = ops.new_input("F32", (hd, n_head, n_tokens), "q")
        keys = ops.view(k_cache, (hd, n_head_kv, n_kv), (2, 2 * hd, k_cache.nb[1]))
        values = ops.view(v_cache, (hd, n_head_kv, n_kv), (2, 2 * hd, v_cache.nb[1]))
        kq = ops.mul_mat(ops.permute(keys, 0, 2, 1, 3), ops.permute(q, 0, 2, 1, 3))  # [n_kv, n_tokens, n_head]
        kqv = ops.mul_mat(ops.permute(values, 1, 2, 0, 3), kq)                        # [hd, n_tokens, n_head]
        return {"k_cache": k_cache, "v_cache": v_cache, "q": q}, [kq, kqv]
    inputs = {"k_cache": randn(n_kv, hd * n_head_kv), "v_cache": randn(n_kv, hd * n_head_kv),
              "q": randn(n_tokens, n_head, hd)}
    vk, cpu = on_vulkan_and_cpu(build, inputs)
    assert vk.ops_on("cpu") == []
    assert_close(vk.outputs[0], cpu.outputs[0], REL)
    # kq is rounded to F16 before V multiplies it: a last-bit difference in kq moves a value that sits
    # on an F16 rounding boundary by one F16 ulp, so kqv agrees to about 2**-11 of its terms.
    assert_close(vk.outputs[1], cpu.outputs[1], 2.0 ** -10)


def test_batched_weights_broadcast_over_dims_2_and_3():
    def build():
        w = ops.new_input("F32", (32, 6, 2, 1), "w")
        x = ops.new_input("F32", (32, 5, 4, 3), "x")
        return {"w": w, "x": x}, [ops.mul_mat(w, x)]
    check(build, {"w": randn(1, 2, 6, 32), "x": randn(3, 4, 5, 32)})


def test_q_k_and_v_share_one_rounding_of_their_input():
    w_data = [weight_data("Q4_K", 32, 256) for _ in range(3)]

    def build():
        x = ops.new_input("F32", (256, 2), "x")
        return {"x": x}, [ops.mul_mat(weight("Q4_K", data, f"w{i}"), x) for i, data in enumerate(w_data)]
    inputs = {"x": randn(2, 256)}
    vk, cpu = on_vulkan_and_cpu(build, inputs)
    [split] = [s for s in vk.scheduler.splits if s.backend.name == "vulkan"]
    names = [d.pipeline.name for d in split.plan.dispatches]
    assert names.count("round_act_q8_k") == 1 and names.count("mul_mat_vec_q4_k") == 3
    for got, want in zip(vk.outputs, cpu.outputs):
        assert_close(got, want, REL)


@pytest.mark.parametrize("weight_type, rounding", [("Q4_0", "Q8_0"), ("Q4_1", "Q8_1"), ("Q4_K", "Q8_K")])
def test_activations_are_rounded_exactly_as_ggml_quantizes_them(weight_type, rounding):
    """The scratch round_act writes holds dequantize(quantize(x, vec_dot_type)), bit for bit."""
    n, k = 600, 512
    x = randn(n, k) * np.exp(randn(n, 1) * 3)     # rows of very different magnitudes
    x[0, :256] = 0.0                                 # an all-zero block
    x[1, 5], x[1, 9] = 7.0, -7.0                     # ties for the largest |x| (Q8_K keeps the first)

    def build():
        w, xs = ops.new_input(weight_type, (k, 2), "w"), ops.new_input("F32", (k, n), "x")
        return {"w": w, "x": xs}, [ops.mul_mat(w, xs)]
    on_vulkan_and_cpu(build, {"w": weight_data(weight_type, 2, k), "x": x})
    scratch = vulkan()._scratch
    got = np.frombuffer(scratch.read(0, x.nbytes), np.float32).reshape(n, k)
    want = dequantize(quantize(x, rounding), rounding).reshape(n, k)
    np.testing.assert_array_equal(got, want)


# -- device limits: bindings over maxStorageBufferRange, grids over maxComputeWorkGroupCount ----------------
@pytest.fixture
def small_device_limits():
    """Pretend the device binds at most 64 KiB and launches at most 5 groups per dimension."""
    device = vulkan().device
    saved = device.limits
    device.limits = replace(saved, max_storage_range=64 << 10, max_groups=(5, 5, 5))
    yield device.limits
    device.limits = saved


@pytest.mark.parametrize("n", [1, 70])
@pytest.mark.parametrize("type_name", ["F16", "Q4_0", "Q6_K"])
def test_a_weight_larger_than_a_binding_is_split_into_row_slices(small_device_limits, type_name, n):
    k, m = 1024, 200   # F16: 400 KiB, six times the pretend limit
    w_data = weight_data(type_name, m, k)

    def build():
        x = ops.new_input("F32", (k, n), "x")
        return {"x": x}, [ops.mul_mat(weight(type_name, w_data), x)]
    vk, cpu = on_vulkan_and_cpu(build, {"x": randn(n, k)})
    [split] = [s for s in vk.scheduler.splits if s.backend.name == "vulkan"]
    assert sum(d.pipeline.name.startswith("mul_mat") for d in split.plan.dispatches) >= 3   # slices of rows
    for d in split.plan.dispatches:
        assert all(size <= small_device_limits.max_storage_range for _, _, size in d.bindings)
        assert all(g <= 5 for g in d.groups)
    assert_close(vk.outputs[0], cpu.outputs[0], REL)


def test_row_ops_split_their_grid_and_windows(small_device_limits):
    def build():
        a, b = ops.new_input("F32", (512, 90, 2), "a"), ops.new_input("F32", (512, 1, 2), "b")
        e, i = ops.new_input("Q8_0", (512, 300), "e"), ops.new_input("I32", (7,), "i")
        cache, src = ops.new_input("F16", (512, 200), "cache"), ops.new_input("F32", (512, 3), "src")
        ids = ops.new_input("I32", (3,), "ids")
        return ({"a": a, "b": b, "e": e, "i": i, "cache": cache, "src": src, "ids": ids},
                [ops.soft_max(ops.add(a, b)), ops.get_rows(e, i), ops.set_rows(cache, src, ids)])
    inputs = {"a": randn(2, 90, 512), "b": randn(2, 1, 512), "e": weight_data("Q8_0", 300, 512),
              "i": np.array([0, 299, 150, 64, 65, 200, 1], np.int32), "cache": randn(200, 512),
              "src": randn(3, 512), "ids": np.array([199, 0, 128], np.int32)}
    vk, cpu = on_vulkan_and_cpu(build, inputs)
    assert vk.ops_on("cpu") == []
    for got, want in zip(vk.outputs, cpu.outputs):
        assert_close(got, want, REL)


def test_uncached_mapped_memory_is_read_through_staging(monkeypatch):
    """A discrete GPU's mapped memory (resizable BAR) is written in place but read through a staging copy."""
    buf = vulkan().alloc_buffer(3000)
    assert buf.is_mapped
    monkeypatch.setattr(buf.allocation, "host_cached", False)
    downloads = []
    staging = staging_for(buf.device)
    monkeypatch.setattr(staging, "download", lambda *args: downloads.append(args) or Staging.download(staging, *args))
    data = rng.integers(0, 256, 1000, dtype=np.uint8)
    buf.write(1001, data)
    assert (buf.read(1001, 1000) == data).all()
    assert len(downloads) == 1


def test_staged_transfers_are_recorded_once_and_never_outlive_their_buffer(monkeypatch):
    monkeypatch.setattr(DeviceBuffer, "map_when_possible", False)
    staging = staging_for(vulkan().device)
    recorded = []
    monkeypatch.setattr(staging, "_record", lambda *args: recorded.append(args[1:]) or Staging._record(staging, *args))
    for round_ in range(3):   # a fresh buffer each round: the last one's recorded copies must not be reused
        buf = vulkan().alloc_buffer(4096)
        for step in range(3):
            data = rng.integers(0, 256, 512, dtype=np.uint8)
            buf.write(100, data)
            assert (buf.read(100, 512) == data).all()
        assert len(recorded) == 2 * (round_ + 1)   # one upload and one download recorded per buffer
        del buf


def test_results_are_the_same_through_staging_buffers(monkeypatch):
    """Discrete GPUs without resizable BAR can't map device memory: transfers go through a staging buffer."""
    monkeypatch.setattr(DeviceBuffer, "map_when_possible", False)
    buf = vulkan().alloc_buffer(3000)
    assert not buf.is_mapped
    data = rng.integers(0, 256, 1000, dtype=np.uint8)
    buf.write(1001, data)
    assert (buf.read(1001, 1000) == data).all()

    w_data = weight_data("Q5_1", 16, 64)

    def build():
        x = ops.new_input("F32", (64, 2), "x")
        return {"x": x}, [ops.silu(ops.mul_mat(weight("Q5_1", w_data), x))]
    check(build, {"x": randn(2, 64)})
