"""The bert architecture against transformers (PyTorch CPU, fp32) on a tiny random model converted by
``ggflow convert``: per-token hidden states, many sequences in one ubatch kept apart, pooling, and a
BertForSequenceClassification reranker's scores.

Tolerances: the model is fp32 end to end, the differences are float32 summation order and ggml's GELU
(the tanh approximation, where BERT's is erf: |diff| < 1e-3 per activation); 2e-3 absolute on states of
magnitude ~1 covers both and would not hide a wrong norm, mask or position (those move values by O(1)).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the reference) is not installed: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="transformers (the reference) is not installed")

from ggflow.api import LLM  # noqa: E402
from ggflow.convert import convert  # noqa: E402
from tests.fixtures.tiny_bert import make_tiny_bert  # noqa: E402

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France!", "bananas", "what is the river's blue sky?"]
ATOL = 2e-3


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_bert")
    model = make_tiny_bert(d / "hf")
    convert(d / "hf", d / "bert.gguf", "f32", progress=False)
    return model, LLM(str(d / "bert.gguf"), n_ctx=64, n_threads=1, pooling_type="none")


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_reranker")
    model = make_tiny_bert(d / "hf", classifier=True, seed=1)
    convert(d / "hf", d / "rerank.gguf", "f32", progress=False)
    return model, LLM(str(d / "rerank.gguf"), n_ctx=64, n_threads=1)


def hf_states(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0].numpy()


def test_hidden_states_equal_transformers(tiny_bert):
    hf, llm = tiny_bert
    for text in TEXTS:
        ids = llm.tokenize(text)
        got = np.array(llm.embed(text))                         # pooling none: [n_tokens, n_embd]
        np.testing.assert_allclose(got, hf_states(hf, ids), atol=ATOL)


def test_sequences_in_one_ubatch_do_not_see_each_other(tiny_bert):
    hf, llm = tiny_bert
    together = llm.embed(TEXTS)                                 # all four fit one ubatch
    alone = [llm.embed(t) for t in TEXTS]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)


def test_mean_cls_last_pooling(tiny_bert, tmp_path):
    hf, llm = tiny_bert
    ids = [llm.tokenize(t) for t in TEXTS]
    states = [hf_states(hf, i) for i in ids]
    for kind, want in (("mean", [s.mean(0) for s in states]), ("cls", [s[0] for s in states]),
                       ("last", [s[-1] for s in states])):
        llm.pooling_type = kind
        try:
            got = np.array(llm.embed(TEXTS))
        finally:
            llm.pooling_type = "none"
        np.testing.assert_allclose(got, np.array(want), atol=ATOL, err_msg=kind)


def test_reranker_scores_equal_transformers(tiny_reranker):
    hf, llm = tiny_reranker
    query, docs = "what is the capital of france", ["Paris is the capital of France.", "bananas are yellow",
                                                    "the cat sat on the mat", "a green river"]
    results = llm.rerank(query, docs)
    got = {r["index"]: r["relevance_score"] for r in results}
    for i, doc in enumerate(docs):
        ids = llm.tokenize(query) + llm.tokenize(doc, add_bos=False) + [llm.vocab.special.sep]
        with torch.no_grad():   # token types all 0, as llama.cpp feeds them (see docs/encoders.md)
            want = hf(torch.tensor([ids]), token_type_ids=torch.zeros(1, len(ids), dtype=torch.long)).logits[0, 0]
        assert got[i] == pytest.approx(float(want), abs=ATOL)
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert [r["document"]["text"] for r in results] == [docs[r["index"]] for r in results]
    assert len(llm.rerank(query, docs, top_n=2)) == 2


def test_an_encoder_does_not_generate(tiny_bert):
    from ggflow.api.encoder import ModelKindError

    with pytest.raises(ModelKindError, match="encoder"):
        tiny_bert[1].create_completion("The cat", max_tokens=2)


def test_an_embedding_model_does_not_rerank(tiny_bert):
    from ggflow.api.encoder import ModelKindError

    with pytest.raises(ModelKindError, match="not a reranker"):
        tiny_bert[1].rerank("q", ["d"])


def test_too_long_input_is_cut_keeping_sep_or_refused_with_both_lengths(tiny_bert):
    from ggflow.errors import ArgumentError

    llm = tiny_bert[1]
    long_text = " ".join(["cat"] * 100)                        # 102 tokens; the model has 64 positions
    with pytest.raises(ArgumentError, match="at most 64 tokens.*102"):
        llm.embed(long_text, truncate=False)
    cut = llm.embed(long_text)                                  # truncate=True (default)
    assert len(cut) == 64


def test_empty_string_embeds_as_cls_sep(tiny_bert):
    hf, llm = tiny_bert
    ids = llm.tokenize("")
    assert ids == [llm.vocab.bos_id, llm.vocab.special.sep]
    np.testing.assert_allclose(np.array(llm.embed("")), hf_states(hf, ids), atol=ATOL)
