"""Fewer dispatches and barriers: fused chains (fusion.py) give the unfused dispatches' results bit for bit,
barriers go only where a dispatch depends on one since the last (plan.barriers_needed), and the bindings
a shader writes are read from its SPIR-V."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ggflow.backends_builtin.vulkan import VulkanBackend
from ggflow.backends_builtin.vulkan.dispatch import Operand
from ggflow.backends_builtin.vulkan.fusion import _aliasing_is_safe
from ggflow.backends_builtin.vulkan.pipelines import SHADER_DIR, spirv_words, written_bindings
from ggflow.backends_builtin.vulkan.plan import barriers_needed
from ggflow.core import ops
from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK, Context
from ggflow.core.model import Model
from ggflow.core.types import type_traits
from tests.vulkan_harness import assert_close, on_vulkan_and_cpu, requires_vulkan

rng = np.random.default_rng(11)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# -- without a device ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, written", [("binary_add", {2}), ("round_act_q8_1", {1, 2}), ("norm_rms", {1}),
                                           ("add_norm_rms_mul", {1, 3, 5}), ("silu_mul", {2, 3}),
                                           ("rope_neox_f32_f16", {3})])
def test_the_bindings_a_shader_writes_come_from_its_spirv(name, written):
    assert written_bindings(spirv_words(SHADER_DIR / f"{name}.spv")) == written


def dispatch(writes: set[int], *bindings: tuple[object, int, int]):
    return SimpleNamespace(pipeline=SimpleNamespace(writes=frozenset(writes)), bindings=list(bindings))


def test_barriers_go_where_a_dispatch_depends_on_one_since_the_last():
    x, y, w = object(), object(), object()     # buffers
    plan = [
        dispatch({1}, (w, 0, 100), (x, 0, 64)),        # 0: writes x[0:64]
        dispatch({1}, (w, 100, 100), (x, 64, 64)),     # 1: writes x[64:128], reads other weights: independent
        dispatch({1}, (x, 0, 64), (y, 0, 64)),         # 2: reads x[0:64], written by 0: read after write
        dispatch({1}, (x, 64, 64), (y, 64, 64)),       # 3: reads x[64:128], written before the last barrier
        dispatch({0}, (x, 0, 16)),                     # 4: writes x[0:16], which 2 read: write after read
        dispatch({0}, (y, 128, 16)),                   # 5: writes elsewhere in y: independent
        dispatch({0}, (y, 130, 4)),                    # 6: writes what 5 wrote: write after write
    ]
    assert barriers_needed(plan) == [False, False, True, False, True, False, True]


def test_aliasing_is_safe_only_for_exact_aliases_or_disjoint_memory():
    f32, buf, other = type_traits("F32"), object(), object()

    def operand(buffer, offset, n=64):
        return Operand(buffer, offset, f32, (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n))
    a = operand(buf, 0)
    assert _aliasing_is_safe([a, operand(buf, 0)], written=[1])             # in place
    assert _aliasing_is_safe([a, operand(buf, 256)], written=[1])           # right after it
    assert _aliasing_is_safe([a, operand(other, 0)], written=[1])
    assert not _aliasing_is_safe([a, operand(buf, 128)], written=[1])      # half over it
    assert not _aliasing_is_safe([a, operand(buf, 0, n=32)], written=[1])  # a prefix of it


# -- on a device ---------------------------------------------------------------------------------------------
def chains():
    """A residual add -> rms_norm -> weight, a lone rms_norm -> weight, and silu(g) * u, on 3 rows."""
    a, b = ops.new_input("F32", (300, 3), "a"), ops.new_input("F32", (300, 3), "b")
    w = ops.new_input("F32", (300,), "w")
    g, u = ops.new_input("F32", (300, 3), "g"), ops.new_input("F32", (300, 3), "u")
    s = ops.add(a, b)
    first = ops.mul(ops.rms_norm(s, 1e-6), w)
    second = ops.mul(ops.rms_norm(first, 1e-5), w)
    gated = ops.mul(u, ops.silu(g))
    return {"a": a, "b": b, "w": w, "g": g, "u": u}, [s, first, second, gated]


@requires_vulkan
def test_fused_chains_give_the_unfused_results_bit_for_bit(monkeypatch):
    inputs = {"a": randn(3, 300), "b": randn(3, 300), "w": randn(300), "g": randn(3, 300) * 4,
              "u": randn(3, 300)}
    fused, cpu = on_vulkan_and_cpu(chains, inputs)
    names = [d.pipeline.name for s in fused.scheduler.splits if s.backend.name == "vulkan" for d in s.plan.dispatches]
    assert names == ["add_norm_rms_mul", "norm_rms_mul", "silu_mul"]
    monkeypatch.setattr(VulkanBackend, "fuse", False)
    unfused, _ = on_vulkan_and_cpu(chains, inputs)
    for got, want, reference in zip(fused.outputs, unfused.outputs, cpu.outputs):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert_close(got, reference, 1e-5)


@requires_vulkan
def test_a_model_step_fuses_and_is_unchanged_by_it(tiny_model_path, monkeypatch):
    path = tiny_model_path("llama", "Q4_0")
    results = []
    for fuse in (True, False):
        monkeypatch.setattr(VulkanBackend, "fuse", fuse)
        ctx = Context(Model.load(path), n_ctx=64, backends=["vulkan"])
        assert ctx.decode(Batch.from_tokens([5, 17, 42, 100])) == DECODE_OK
        assert ctx.decode(Batch.from_tokens([7], pos0=4)) == DECODE_OK
        plans = [s.plan for s in ctx.scheduler.splits if s.backend.name == "vulkan"]
        results.append((ctx.get_logits().copy(), sum(len(p) for p in plans)))
    (fused, n_fused), (unfused, n_unfused) = results
    np.testing.assert_array_equal(fused.view(np.uint32), unfused.view(np.uint32))
    n_layers = 2
    assert n_unfused - n_fused >= 4 * n_layers   # per layer: two norm chains (2 or 3 nodes each), silu * up
