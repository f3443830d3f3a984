"""End to end against transformers: tiny models of every built-in architecture, written by the tests.

transformers de-permutes llama's Q/K from GGUF's layout and applies RoPE its own way, so agreement
also checks our RoPE convention. Tolerances are relative to the largest reference logit:
- F32 weights, F32 KV cache: 1e-4. Both sides compute in fp32; what differs is summation order
  (BLAS vs our kernels), a few ulps per dot product accumulated over the layers.
- gpt2 with F32 everything: 1e-3. ggml's CPU GELU (and ours, to match llama.cpp) rounds its input to
  fp16 and looks the result up in an fp16 table: 2^-11 relative per activation; measured 2.9e-4.
- F32 weights, F16 KV cache (llama.cpp's default): 3e-3. K/V rounded to fp16 (relative error 2^-11 per
  element) before attention; measured ~1e-3.
- quantized weights: 6e-2. transformers dequantizes the weights and multiplies in fp32; ggml (and we)
  also quantize the activations to the weight's vec_dot_type (8-bit, per-32 or per-256 block scales:
  relative error up to 1/254 per element) before every matmul. Over two layers and the LM head that
  moved logits by 2.2e-2 to 4.2e-2 of their range on these models (qwen3's Q/K norms amplify it most).
  The sharp check of quantized numerics is against llama.cpp itself (test_e2e_llamacpp.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import Context
from ggflow.core.model import Model
from tests.fixtures.tiny_models import SPECS, write_tiny_model
from tests.hf_reference import hf_logits

PROMPT = [5, 17, 42, 100, 7, 3, 250, 12, 9, 77]
N_DECODE = 16

CASES = [(arch, "F32", "F32", 1e-3 if arch == "gpt2" else 1e-4) for arch in SPECS] + [
    ("llama", "F32", "F16", 3e-3),
    ("gpt2", "F32", "F16", 3e-3),
    ("llama", "Q8_0", "F32", 6e-2),
    ("qwen2", "Q4_0", "F32", 6e-2),
    ("qwen3", "Q4_K", "F32", 6e-2),
    ("gpt2", "Q5_1", "F32", 6e-2),
    ("qwen3", "Q6_K", "F32", 6e-2),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


def model_path(model_dir, arch: str, wtype: str):
    path = model_dir / f"{arch}-{wtype}.gguf"
    if not path.exists():
        write_tiny_model(path, arch, wtype)
    return path


def generate(ctx: Context, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Prompt in one batch (all logits), then n greedy tokens one at a time. Returns tokens, logits per position."""
    assert ctx.decode(Batch.from_tokens(prompt, all_logits=True)) == 0
    logits = [ctx.get_logits().copy()]
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(logits[-1][-1])))
        assert ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(tokens) - 1)) == 0
        logits.append(ctx.get_logits().copy())
    return tokens, np.concatenate(logits)


@pytest.mark.parametrize("arch, wtype, kvtype, rtol", CASES, ids=[f"{a}-{w}-kv{k}" for a, w, k, _ in CASES])
def test_logits_match_transformers_over_prompt_and_decode(model_dir, arch, wtype, kvtype, rtol):
    path = model_path(model_dir, arch, wtype)
    ctx = Context(Model.load(path), n_ctx=64, type_k=kvtype, type_v=kvtype, backends="cpu")
    tokens, ours = generate(ctx, PROMPT, N_DECODE)
    ref = hf_logits(path, tokens)[: len(ours)]  # the last token's logits were never computed by us
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < rtol, f"max relative logit error {err:.2e} >= {rtol}"
    assert ctx.n_graph_builds == 2 and ctx.n_graph_reuses == N_DECODE - 1  # prompt graph, then one decode graph


@pytest.mark.parametrize("arch", list(SPECS))
def test_incremental_decode_equals_one_batch(model_dir, arch):
    model = Model.load(model_path(model_dir, arch, "F32"))
    one = Context(model, n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    one.decode(Batch.from_tokens(PROMPT, all_logits=True))
    step = Context(model, n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    rows = []
    for i, tok in enumerate(PROMPT):
        step.decode(Batch.from_tokens([tok], pos0=i))
        rows.append(step.get_logits()[0].copy())
    np.testing.assert_allclose(np.array(rows), one.get_logits(), rtol=0, atol=1e-4 * np.abs(rows).max())
