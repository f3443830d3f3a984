"""Mixture-of-experts architectures end to end against transformers (PyTorch CPU, fp32).

Tiny random qwen3moe and Mixtral-style llama models (tests/fixtures/tiny_moe.py: 2 layers, 8 experts, 2
used) are run over a prompt in one batch and 16 cached decode steps; the logits of every position must match
transformers' forward over the whole sequence. F32 weights and KV cache: both sides compute in fp32 and
differ in summation order only, so the tolerance is 1e-4 of the largest logit, as for the dense models
(test_e2e_reference.py). The experts chosen are the same on both sides (the routers' margins dwarf
rounding), so greedy tokens must be equal too.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.context import Context
from ggflow.core.model import Model
from tests.test_e2e_reference import N_DECODE, PROMPT, generate

torch = pytest.importorskip("torch", reason="torch (the reference) is not installed: pip install torch==2.13.0")
pytest.importorskip("transformers", reason="transformers (the reference) is not installed")

from tests.fixtures.tiny_moe import write_tiny_moe  # noqa: E402


@pytest.fixture(scope="module", params=["qwen3moe", "llama"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / f"{request.param}.gguf"
    return request.param, path, write_tiny_moe(path, request.param)


def test_logits_and_greedy_tokens_match_transformers(tiny):
    arch, path, hf = tiny
    model = Model.load(path)
    assert model.hparams.extra["experts"].n_expert == 8
    ctx = Context(model, n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    tokens, ours = generate(ctx, PROMPT, N_DECODE)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float().numpy()[: len(ours)]
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < 1e-4, f"{arch}: max relative logit error {err:.2e}"
    hf_greedy = ref[len(PROMPT) - 1:-1].argmax(-1)            # transformers' choice after each position
    assert tokens[len(PROMPT):] == hf_greedy.tolist()
