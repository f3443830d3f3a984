"""Mixture-of-experts models with the Vulkan backend (lavapipe in CI): Vulkan has no expert kernels yet, so the
scheduler runs the router and mul_mat_id nodes on the CPU and the rest on Vulkan; the logits must agree with
the CPU backend's alone (gpt-oss's sinks and MXFP4 experts stay on the CPU too). F32 cache: 1e-3 of the largest logit, test_vulkan_models.py's F32 bound
(a single op agrees to ~1e-6; the routers' margins here are far wider than that)."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.context import Context
from ggflow.core.model import Model
from tests.test_e2e_reference import PROMPT, generate
from tests.vulkan_harness import requires_vulkan

pytestmark = requires_vulkan
pytest.importorskip("torch", reason="the tiny MoE models are made in transformers (torch 2.13.0)")
pytest.importorskip("transformers", minversion="5.0",
                    reason="the tiny models are written from transformers 5's layouts (fused expert tensors, rope_parameters)")

from tests.fixtures.tiny_moe import write_tiny_moe  # noqa: E402


@pytest.mark.parametrize("arch, wtype", [("qwen3moe", "F32"), ("llama", "F32"), ("gpt-oss", "MXFP4")])
def test_moe_on_vulkan_matches_the_cpu(tmp_path, arch, wtype):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_moe(path, arch, seed=4, weight_type=wtype)
    cpu = Context(Model.load(path), n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    gpu = Context(Model.load(path), n_ctx=64, type_k="F32", type_v="F32", backends=["vulkan", "cpu"])
    tokens_cpu, logits_cpu = generate(cpu, PROMPT, 4)
    tokens_gpu, logits_gpu = generate(gpu, PROMPT, 4)
    nodes = gpu.scheduler.stats.nodes
    assert nodes.get("vulkan", 0) > 0 and nodes.get("cpu", 0) > 0      # split between the two
    assert tokens_gpu == tokens_cpu
    assert np.abs(logits_gpu - logits_cpu).max() / np.abs(logits_cpu).max() < 1e-3
