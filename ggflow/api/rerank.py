"""``LLM.rerank(query, documents, top_n=None)``: a reranker's (cross-encoder's) relevance scores.

Each document is paired with the query as the model was trained ([CLS] query [SEP] document [SEP]), the
pairs are batched per ubatch, and the classification head's score of each pair's [CLS] row ranks them
(llama.cpp's rank pooling). A model without that head gets a clear error, not made-up scores.
"""
from __future__ import annotations

from typing import Any, Sequence

from ggflow.api import arguments as A
from ggflow.api.encoder import (ModelKindError, fit_tokens, is_reranker, max_input_tokens, pair_tokens,
                                rank_results, score_token_lists)
from ggflow.errors import ArgumentError


class RerankMixin:
    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None, *,
               return_documents: bool = True, truncate: bool = True) -> list[dict[str, Any]]:
        """Documents by relevance to the query, best first: [{"index", "relevance_score", "document"}, ...]
        (Jina's/Cohere's result shape); top_n keeps the first top_n."""
        if not isinstance(query, str):
            raise ArgumentError("query", query, "a string")
        if isinstance(documents, str) or not isinstance(documents, (list, tuple)) or not documents \
                or not all(isinstance(d, str) for d in documents):
            raise ArgumentError("documents", documents, "a non-empty list of strings")
        if top_n is not None:
            A.check_int("top_n", top_n, 1)
        A.check_bool("return_documents", return_documents)
        A.check_bool("truncate", truncate)
        ctx = self._require_context()
        if not is_reranker(self.model):
            raise ModelKindError(f"{self.model_path}: not a reranker (no classification head): rerank needs a "
                                    f"cross-encoder model such as bge-reranker")
        limit = max_input_tokens(ctx)
        pairs = [fit_tokens(pair_tokens(self.vocab, query, d), limit, truncate, f"documents[{i}]", keep_last=True)
                 for i, d in enumerate(documents)]
        with self._lock.turn():
            scores = score_token_lists(ctx, pairs)[:, 0]
        return rank_results(scores, documents, top_n, return_documents)
