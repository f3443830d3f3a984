"""End to end against llama.cpp's own logits for the shared tiny models (tests/data/models, from shared/).

llama.cpp ran them with its defaults: F16 KV cache, no flash attention, 2 threads. ggflow follows the
same numerics (activations quantized to the weight's vec_dot_type, F16 K/V, ggml's GELU table).
Tolerances, relative to the largest reference logit:
- F32 models: 1e-3. Measured: the logits agree to the last bit (F32 dot products in ggml's order).
- quantized models: 5e-2. Measured: the first 12 positions agree to 1e-7 (so weights, activation
  quantization and attention are ggml's), later positions differ by 1.4e-2 to 3.1e-2, the same distance
  both ggflow and llama.cpp have from transformers' unquantized-activation result. The cause is not
  found yet (llama.cpp is itself consistent there: its one-batch and token-by-token logits agree).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import Context
from ggflow.core.model import Model
from tests.data_dir import DATA

SHARED = DATA / "models"
NAMES = ["tiny-llama-hs-f32", "tiny-llama-hs-q8_0", "tiny-llama-hs-q4_0", "tiny-llama-hs-q4_k_m",
         "tiny-qwen2-hs-f32", "tiny-qwen2-hs-q8_0", "tiny-gpt2-hs-f32", "tiny-gpt2-hs-q8_0"]


def rtol(name: str) -> float:
    return 1e-3 if name.endswith("f32") else 5e-2


def load(name: str):
    ref = json.loads((SHARED / f"{name}.llamacpp.json").read_text())
    ctx = Context(Model.load(SHARED / f"{name}.gguf"), n_ctx=512, backends="cpu")  # F16 KV, as llama.cpp
    return ref, ctx


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", NAMES)
def test_prompt_logits_match_llamacpp(name):
    ref, ctx = load(name)
    assert ctx.decode(Batch.from_tokens(ref["prompt_ids"], all_logits=True)) == 0
    expected = np.load(SHARED / f"{name}.llamacpp.prompt_logits.npy")
    assert rel_err(ctx.get_logits(), expected) < rtol(name)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_decoding_matches_llamacpp(name):
    """Token by token, as llama.cpp generated: same logits at every step, same greedy tokens."""
    ref, ctx = load(name)
    prompt, greedy = ref["prompt_ids"], ref["greedy_ids"]
    ctx.decode(Batch.from_tokens(prompt))
    logits = [ctx.get_logits()[-1].copy()]
    for i, tok in enumerate(greedy[:-1]):  # teacher-forced on llama.cpp's tokens, so one miss can't cascade
        assert ctx.decode(Batch.from_tokens([tok], pos0=len(prompt) + i)) == 0
        logits.append(ctx.get_logits()[-1].copy())
    logits = np.array(logits)
    expected = np.load(SHARED / f"{name}.llamacpp.gen_logits.npy")
    assert rel_err(logits, expected) < rtol(name)
    # Where llama.cpp's top two were further apart than our error, we must pick the same token.
    margin = np.sort(expected, axis=1)[:, -1] - np.sort(expected, axis=1)[:, -2]
    decisive = margin > 2 * np.abs(logits - expected).max()
    assert (np.argmax(logits, axis=1) == np.array(greedy))[decisive].all()
    assert ctx.n_graph_reuses == len(greedy) - 2  # one decode graph, reused for every step after the first


@pytest.mark.parametrize("name", ["tiny-llama-hs-f32", "tiny-gpt2-hs-f32"])
def test_full_sequence_in_one_batch_matches_llamacpp(name):
    ref, ctx = load(name)
    seq = ref["prompt_ids"] + ref["greedy_ids"]
    ctx.decode(Batch.from_tokens(seq, all_logits=True))
    expected = np.load(SHARED / f"{name}.llamacpp.full_logits.npy")
    assert rel_err(ctx.get_logits(), expected) < rtol(name)
