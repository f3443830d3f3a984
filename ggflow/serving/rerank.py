"""``POST /v1/rerank`` and ``/rerank`` (llama-server's, Jina's and Cohere's shape), and the serving modes of
``ggflow serve --embedding`` / ``--reranking``.

Request: {"query": str, "documents": [str | {"text": str}], "top_n"?: int, "return_documents"?: bool}.
Response: {"object": "list", "model", "results": [{"index", "relevance_score", "document"?: {"text"}}] (best
first, the first top_n), "usage": {"prompt_tokens", "total_tokens"}}. The pairs are scored in the engine
thread (the only code that touches the Context) by ``api.encoder``, batched per ubatch, a step's budget of
them at a time (``EncoderJob``, a side job: a long list does not hold the engine). A model without a
classification head answers 400; so does a generation route on an encoder or on a ``--embedding`` server.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Union

from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict

from ggflow.api.encoder import (ModelKindError, fit_tokens, is_encoder, is_reranker, max_input_tokens, pair_tokens,
                                rank_results)
from ggflow.errors import GGFlowError
from ggflow.serving.embeddings import EncoderJob


@dataclass(frozen=True)
class ServingModes:
    """llama-server's --embedding (no generation routes) and --reranking (the model must rerank)."""
    embedding_only: bool = False
    reranking: bool = False

    def check_model(self, model: Any) -> None:
        """At load: a --reranking server needs a reranker."""
        if self.reranking and not is_reranker(model):
            raise ModelKindError(f"--reranking needs a reranker (a model with a classification head, "
                                 f"cls.output.weight); {model.path} has none")


def modes_of(app: Any) -> ServingModes:
    return getattr(app.state, "ggflow_modes", None) or ServingModes()


def check_can_generate(http: Any, engine: Any) -> None:
    """A 400 for a generation request the server cannot serve (an encoder, or a --embedding server)."""
    if is_encoder(engine.ctx.model):
        raise ModelKindError(f"this server runs an encoder ({engine.ctx.model.metadata.arch}): it serves "
                             f"/v1/embeddings (and /v1/rerank for a reranker), not text generation")
    if modes_of(http.app).embedding_only:
        raise ModelKindError("this server was started with --embedding: it serves /v1/embeddings only")


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class RerankBody(BaseModel):
    model_config = ConfigDict(extra="allow")   # Cohere's and Jina's other fields are accepted and ignored
    query: str
    documents: list[Union[str, _Document]]
    top_n: int | None = None
    return_documents: bool = True
    model: str | None = None

    def texts(self) -> list[str]:
        if not self.documents:
            raise GGFlowError("documents is empty: give at least one document")
        if self.top_n is not None and self.top_n < 1:
            raise GGFlowError(f"top_n must be at least 1, got {self.top_n}")
        return [d if isinstance(d, str) else d.text for d in self.documents]


def add_rerank_routes(app: Any, state: Any, parse: Callable) -> None:
    """Register /v1/rerank and /rerank on the app (``parse``: the app's JSON body parser)."""

    async def rerank(http: HTTPRequest):
        body = await parse(http, RerankBody)
        engine = state.ready()
        model = engine.ctx.model
        if not is_reranker(model):
            raise ModelKindError(f"this model ({model.metadata.arch}) is not a reranker: it has no classification "
                                 f"head; serve a reranker such as bge-reranker with --reranking")
        docs = body.texts()
        limit = max_input_tokens(engine.ctx)
        pairs = [fit_tokens(pair_tokens(engine.vocab, body.query, d), limit, True, f"documents[{i}]", True)
                 for i, d in enumerate(docs)]
        scores = await asyncio.wrap_future(engine.run_side(EncoderJob(engine, pairs, score=True)))
        n = sum(len(p) for p in pairs)
        return {"object": "list", "model": state.model_name,
                "results": rank_results(scores, docs, body.top_n, body.return_documents),
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    for path in ("/v1/rerank", "/rerank"):
        app.post(path)(rerank)
