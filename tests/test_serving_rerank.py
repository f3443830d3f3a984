"""The server on encoders: the openai client's ``embeddings.create`` on a BERT model (the vectors LLM.embed
gives), httpx calls to ``/v1/rerank`` and ``/rerank`` in llama-server's and Jina's/Cohere's shapes (the
scores LLM.rerank gives), and the 400s: rerank on a model without a classification head, generation on an
encoder or on a --embedding server; ``ggflow serve --reranking`` refusing a model that cannot rerank."""
from __future__ import annotations

import contextlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is needed to build the tiny models: pip install torch==2.13.0")
pytest.importorskip("transformers", reason="transformers is needed to build the tiny models")
uvicorn = pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")
openai = pytest.importorskip("openai", reason="the openai client is the reference client")
httpx = pytest.importorskip("httpx")

from ggflow.api import LLM  # noqa: E402
from ggflow.convert import convert  # noqa: E402
from ggflow.serving.app import ServerState  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from ggflow.serving.rerank import ServingModes  # noqa: E402
from tests.fixtures.tiny_bert import make_tiny_bert  # noqa: E402
from tests.test_serving_http import free_port, serving as serving_state  # noqa: E402

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France!", "bananas"]
QUERY, DOCS = "what is the capital of france", ["bananas are yellow", "Paris is the capital of France.",
                                                "the cat sat on the mat"]


@contextlib.contextmanager
def serving(path, modes: ServingModes):
    engine = Engine.load(str(path), n_ctx=64, n_slots=2, n_threads=1)
    engine.start()
    with serving_state(ServerState(model_name="tiny", engine=engine), modes=modes) as url:
        yield url


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve_encoders")
    make_tiny_bert(d / "embed")
    make_tiny_bert(d / "rerank", classifier=True, seed=1)
    convert(d / "embed", d / "embed.gguf", "f32", progress=False)
    convert(d / "rerank", d / "rerank.gguf", "f32", progress=False)
    return d / "embed.gguf", d / "rerank.gguf"


def test_openai_embeddings_on_an_encoder(models):
    with serving(models[0], ServingModes(embedding_only=True)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        out = client.embeddings.create(model="tiny", input=TEXTS)
        got = np.array([d.embedding for d in out.data])
        with httpx.Client(base_url=url) as h:
            r = h.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 2})
            assert r.status_code == 400 and "encoder" in r.json()["error"]["message"]
            r = h.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
            assert r.status_code == 400 and "not a reranker" in r.json()["error"]["message"]
    want = np.array(LLM(str(models[0]), n_ctx=64, n_threads=1, pooling_type="mean").embed(TEXTS, normalize=True))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert out.usage.prompt_tokens == sum(len(LLM(str(models[0]), vocab_only=True).tokenize(t)) for t in TEXTS)


def test_rerank_routes_in_llama_server_and_jina_cohere_shapes(models):
    want = LLM(str(models[1]), n_ctx=64, n_threads=1).rerank(QUERY, DOCS)
    with serving(models[1], ServingModes(reranking=True)) as url, httpx.Client(base_url=url) as h:
        r = h.post("/v1/rerank", json={"model": "tiny", "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
        assert [x["index"] for x in body["results"]] == [x["index"] for x in want]
        for got, ref in zip(body["results"], want):
            assert got["relevance_score"] == pytest.approx(ref["relevance_score"], abs=1e-5)
            assert got["document"] == {"text": DOCS[got["index"]]}
        # Jina/Cohere: documents as objects, top_n, return_documents
        r = h.post("/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 2,
                                    "return_documents": False})
        assert r.status_code == 200
        results = r.json()["results"]
        assert len(results) == 2 and all("document" not in x for x in results)
        assert [x["index"] for x in results] == [x["index"] for x in want[:2]]
        for bad in ({"query": QUERY, "documents": []}, {"query": QUERY, "documents": DOCS, "top_n": 0},
                    {"documents": DOCS}):
            assert h.post("/v1/rerank", json=bad).status_code == 400


def test_serve_reranking_refuses_a_model_without_a_classification_head(models):
    run = subprocess.run([sys.executable, "-m", "ggflow.cli", "serve", "-m", str(models[0]), "--reranking",
                          "--port", str(free_port()), "-c", "64", "-np", "1"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and "--reranking needs a reranker" in run.stderr
