"""Mixture-of-experts architectures (and granite) end to end against transformers (PyTorch CPU, fp32).

Tiny random qwen3moe and Mixtral-style llama models (tests/fixtures/tiny_moe.py: 2 layers, 8 experts, 2
used), a dense granite with its four multipliers set away from 1, a phi3 with LongRoPE factors and a
gpt-oss (sinks, a sliding window of 8 on alternate layers, YaRN, biased router and experts, clamped SwiGLU;
transformers' YaRN told to truncate its correction range as ggml does), are run over a prompt in one batch and 16 cached decode steps; the logits of every position must match
transformers' forward over the whole sequence. F32 weights and KV cache: both sides compute in fp32 and
differ in summation order only, so the tolerance is 1e-4 of the largest logit, as for the dense models
(test_e2e_reference.py); rounding of 1e-5 cannot change which experts a token chooses, so greedy tokens
must be equal too. Quantized experts (Q8_0, Q4_0; everything else F32): transformers runs the experts as
they decode, and the 6e-2 of test_e2e_reference.py covers ggml's quantized activations. Those move the
next layer's router logits by up to ~0.1 on these tiny models, where a token's 2nd and 3rd expert are
often closer than that (most seeds have a gap under 0.03 somewhere): one expert chosen differently moves
that token's logits by 0.1-0.5, so each quantized case uses a seed whose smallest router margin on its
tokens is checked to be clear (router_margin), and greedy tokens are not compared there.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.context import Context
from ggflow.core.model import Model
from tests.test_e2e_reference import N_DECODE, PROMPT, generate

torch = pytest.importorskip("torch", reason="torch (the reference) is not installed: pip install torch==2.13.0")
pytest.importorskip("transformers", minversion="5.0",
                    reason="the tiny models are written from transformers 5's layouts (fused expert tensors, rope_parameters)")

from tests.fixtures.tiny_moe import router_margin, write_tiny_moe  # noqa: E402


# (arch, experts' type, seed, rtol, smallest router margin the seed must have on these tokens)
CASES = [("qwen3moe", "F32", 0, 1e-4, 0.0), ("llama", "F32", 0, 1e-4, 0.0), ("granite", "F32", 0, 1e-4, 0.0),
         ("phi3", "F32", 0, 1e-4, 0.0), ("gpt-oss", "F32", 0, 1e-4, 0.0),
         # MXFP4 experts: measured 2.4e-3 to 4.4e-3 over seeds 0-5 (the activations' Q8_0 rounding only)
         ("gpt-oss", "MXFP4", 4, 1e-2, 0.1),
         ("qwen3moe", "Q8_0", 8, 6e-2, 0.08), ("llama", "Q4_0", 1, 6e-2, 0.1)]


@pytest.mark.parametrize("arch, wtype, seed, rtol, margin", CASES, ids=[f"{a}-{w}" for a, w, *_ in CASES])
def test_logits_and_greedy_tokens_match_transformers(tmp_path, arch, wtype, seed, rtol, margin):
    path = tmp_path / f"{arch}-{wtype}.gguf"
    hf = write_tiny_moe(path, arch, seed=seed, weight_type=wtype)
    model = Model.load(path)
    assert arch in ("granite", "phi3") or model.hparams.extra["experts"].n_expert == 8
    ctx = Context(model, n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    tokens, ours = generate(ctx, PROMPT, N_DECODE)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float().numpy()[: len(ours)]
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < rtol, f"{arch}: max relative logit error {err:.2e}"
    assert not margin or router_margin(hf, tokens) > margin, "the routers have a near tie here: the case needs another seed"
    if wtype == "F32":
        hf_greedy = ref[len(PROMPT) - 1:-1].argmax(-1)        # transformers' choice after each position
        assert tokens[len(PROMPT):] == hf_greedy.tolist()


def test_phi3_takes_the_long_rope_factors_past_its_original_context(tmp_path):
    """A context longer than the original (128) rotates by the long factors (llama.cpp chooses by the
    context); transformers takes them for a sequence longer than 128, so a 140-token prompt compares both."""
    from tests.fixtures.tiny_moe import PHI3_ORIG_CTX
    path = tmp_path / "phi3.gguf"
    hf = write_tiny_moe(path, "phi3")
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 300, PHI3_ORIG_CTX + 12)]
    ctx = Context(Model.load(path), n_ctx=256, type_k="F32", type_v="F32", backends="cpu")
    tokens, ours = generate(ctx, prompt, 4)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float().numpy()[: len(ours)]
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < 1e-4, f"phi3 long context: max relative logit error {err:.2e}"


@pytest.mark.parametrize("arch, wtype", [("qwen3moe", "F32"), ("qwen3moe", "Q8_0"), ("llama", "Q4_0")])
def test_token_by_token_equals_one_batch_bit_for_bit(tmp_path, arch, wtype):
    """mul_mat_id groups a prompt's rows by expert; a row's result must not depend on which rows came with it
    (a prompt's last token re-evaluated alone after a KV-prefix reuse gives the logits the prompt gave)."""
    from ggflow.core.batch import Batch
    path = tmp_path / f"{arch}-{wtype}.gguf"
    write_tiny_moe(path, arch, seed=1, weight_type=wtype)
    model = Model.load(path)
    one = Context(model, n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    assert one.decode(Batch.from_tokens(PROMPT, all_logits=True)) == 0
    step = Context(model, n_ctx=64, type_k="F32", type_v="F32", backends="cpu")
    rows = []
    for i, tok in enumerate(PROMPT):
        assert step.decode(Batch.from_tokens([tok], pos0=i)) == 0
        rows.append(step.get_logits()[0].copy())
    np.testing.assert_array_equal(np.array(rows), one.get_logits())
