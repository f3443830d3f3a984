"""The nomic-bert architecture (nomic-embed-text) against transformers' NomicBertModel (PyTorch CPU, fp32) on a
tiny random model converted by ``ggflow convert``, from transformers' spelling and from nomic-ai's own.

Tolerance: fp32 end to end; the differences are float32 summation order (no GELU here: SwiGLU's silu is
exact), 1e-3 absolute on states of magnitude ~1, where a wrong RoPE mode, norm or Q/K/V split moves values
by O(0.1-1).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the reference) is not installed: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="transformers (the reference) is not installed")

from ggflow.api import LLM  # noqa: E402
from ggflow.convert import ConvertError, convert  # noqa: E402
from ggflow.core.gguf_file import GGUFFile  # noqa: E402
from tests.fixtures.tiny_bert import make_tiny_nomic_bert  # noqa: E402

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France!", "bananas",
         "what is the river's blue sky? " * 3]
ATOL = 1e-3


@pytest.fixture(scope="module", params=[False, True], ids=["transformers-names", "nomic-names"])
def tiny_nomic(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_nomic")
    model = make_tiny_nomic_bert(d / "hf", nomic_names=request.param)
    convert(d / "hf", d / "nomic.gguf", "f32", progress=False)
    return model, d / "nomic.gguf", LLM(str(d / "nomic.gguf"), n_ctx=64, n_threads=1, pooling_type="none")


def hf_states(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0].numpy()


def test_the_file_has_llama_cpps_names_and_keys(tiny_nomic):
    _, path, _ = tiny_nomic
    f = GGUFFile(str(path))
    fields = f.fields
    assert fields["general.architecture"] == "nomic-bert"
    assert fields["nomic-bert.rope.freq_base"] == 1000.0 and fields["nomic-bert.attention.causal"] is False
    names = {t.name for t in f.tensors}
    assert "blk.0.attn_qkv.weight" in names and "blk.1.ffn_gate.weight" in names
    assert not any(".attn_q." in n or "position_embd" in n for n in names)


def test_hidden_states_equal_transformers(tiny_nomic):
    hf, _, llm = tiny_nomic
    for text in TEXTS:
        got = np.array(llm.embed(text))                                 # pooling none: [n_tokens, n_embd]
        np.testing.assert_allclose(got, hf_states(hf, llm.tokenize(text)), atol=ATOL)


def test_sequences_in_one_ubatch_keep_their_own_positions(tiny_nomic):
    _, _, llm = tiny_nomic
    together = llm.embed(TEXTS)
    for text, got in zip(TEXTS, together):
        np.testing.assert_allclose(np.array(got), np.array(llm.embed(text)), atol=1e-5)


@pytest.mark.parametrize("key, value", [("prenorm", True), ("rotary_emb_fraction", 0.5), ("moe_every_n_layers", 2)])
def test_options_llama_cpp_does_not_run_are_refused(tmp_path, key, value):
    import json
    make_tiny_nomic_bert(tmp_path / "hf", nomic_names=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[key] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=key):
        convert(tmp_path / "hf", tmp_path / "out.gguf", "f32", progress=False)
    assert not (tmp_path / "out.gguf").exists()
