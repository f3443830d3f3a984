"""``ggflow convert`` round trip for the causal architectures: a tiny random Hugging Face model of each
(llama, Mistral-style llama, qwen2, qwen3, gpt2) converted at F32, loaded by ggflow, gives transformers'
logits (PyTorch CPU, fp32) on the same tokens.

Tolerance 2e-3 absolute on logits of magnitude ~1: float32 summation order, F16 K/V in ggflow's cache,
and ggml's tanh GELU for gpt2; a wrong permutation, transpose or tie moves logits by O(1).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the reference) is not installed: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="transformers (the reference) is not installed")

from ggflow.api import LLM  # noqa: E402
from ggflow.convert import convert  # noqa: E402
from ggflow.core.gguf_file import GGUFFile  # noqa: E402
from tests.fixtures.tiny_decoders import VOCAB_GGUF, make_tiny_decoder  # noqa: E402


PROMPT = "The quick brown fox jumps over the lazy dog, and then"


@pytest.mark.parametrize("kind, arch", [("llama", "llama"), ("mistral", "llama"), ("qwen2", "qwen2"),
                                        ("qwen3", "qwen3"), ("gpt2", "gpt2")])
def test_converted_model_gives_transformers_logits(tmp_path, kind, arch):
    hf = make_tiny_decoder(kind, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    assert convert(tmp_path / "hf", out, "f32", progress=False) == arch
    fields = GGUFFile(out).fields
    assert fields["general.architecture"] == arch and fields["tokenizer.ggml.pre"] == "gpt-2"
    llm = LLM(str(out), n_ctx=128, n_threads=1)
    ids = llm.tokenize(PROMPT, add_bos=False)
    got, _ = llm._eval_prompt(ids, all_logits=True)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=2e-3)


def test_tokens_of_the_converted_vocabulary_equal_the_hugging_face_tokenizer(tmp_path):
    from tokenizers import Tokenizer

    from tests.encoder_corpus import SENTENCES

    make_tiny_decoder("gpt2", tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "m.gguf", "f32", progress=False)
    llm = LLM(str(tmp_path / "m.gguf"), vocab_only=True)
    hf = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    for text in SENTENCES:
        assert llm.tokenize(text, add_bos=False) == hf.encode(text).ids, text
