"""Running an encoder (BERT and kin) over many inputs: embeddings and reranking scores.

An encoder keeps no cache, so inputs are independent: as many whole inputs as fit ``n_ubatch`` tokens (and
the memory's sequence ids) go into one ubatch, each its own sequence from position 0, kept apart by the
mask. Pooling is done here on the output rows: mean over each sequence's tokens, the first (cls) or last
token's row, or every row (none); rank asks the graph for the [CLS] rows only, which the architecture's
classification head turns into scores. Used by ``LLM`` (embed, create_embedding, rerank) and the server.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggflow.core.batch import Batch
from ggflow.errors import ArgumentError, ContextFullError, GGFlowError


class ModelKindError(GGFlowError, ValueError):
    """Reranking asked of a model that is no reranker, or generation of an encoder."""


def is_encoder(model: Any) -> bool:
    return bool(model is not None and model.hparams.extra.get("encoder"))


def is_reranker(model: Any) -> bool:
    return is_encoder(model) and getattr(model.w, "cls_out", None) is not None


def max_input_tokens(ctx: Any) -> int:
    """The longest input one ubatch holds: n_ubatch, the context, and the learned positions bound it."""
    return min(ctx.n_ubatch, ctx.n_ctx, ctx.model.hparams.n_ctx_train)


def fit_tokens(tokens: list[int], limit: int, truncate: bool, what: str, keep_last: bool) -> list[int]:
    """tokens cut to limit (keeping the closing [SEP] where keep_last), or an error with both lengths."""
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise ArgumentError(what, f"{len(tokens)} tokens", f"at most {limit} tokens, the model's limit here "
                            f"(or truncate=True); it has {len(tokens)}")
    return tokens[:limit - 1] + tokens[-1:] if keep_last and limit > 1 else tokens[:limit]


def _groups(token_lists: Sequence[list[int]], n_ubatch: int, n_seq_max: int) -> list[list[int]]:
    """Indices of the inputs, packed in order into groups of at most n_ubatch tokens and n_seq_max inputs."""
    groups, current, used = [], [], 0
    for i, tokens in enumerate(token_lists):
        if current and (used + len(tokens) > n_ubatch or len(current) == n_seq_max):
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += len(tokens)
    if current:
        groups.append(current)
    return groups


def _run(ctx: Any, token_lists: Sequence[list[int]], group: list[int], outputs: str) -> np.ndarray:
    """Decode one group as one ubatch; the output rows (all tokens, or each input's first/last)."""
    lists = [token_lists[i] for i in group]
    lengths = np.array([len(t) for t in lists])
    tokens = np.concatenate([np.asarray(t, np.int64) for t in lists])
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = np.arange(len(tokens)) - np.repeat(starts, lengths)
    seq = np.repeat(np.arange(len(lists)), lengths)
    if outputs == "all":
        want = np.ones(len(tokens), bool)
    else:
        want = np.zeros(len(tokens), bool)
        want[starts if outputs == "first" else starts + lengths - 1] = True
    if ctx.decode(Batch(tokens, pos, seq, want)) != 0:
        raise ContextFullError("the inputs do not fit the context")
    return ctx.get_logits().copy()


def embed_token_lists(ctx: Any, token_lists: Sequence[list[int]], pooling: str) -> list[np.ndarray]:
    """One pooled vector (or [n_tokens, n_embd] with pooling "none") per input, inputs batched per ubatch."""
    outputs = {"cls": "first", "last": "last"}.get(pooling, "all")
    vectors: list[np.ndarray] = []
    ctx.set_embeddings(True)
    try:
        for group in _groups(token_lists, ctx.n_ubatch, ctx.memory.n_seq_max):
            rows = _run(ctx, token_lists, group, outputs)
            if outputs != "all":
                vectors += list(rows)
                continue
            lengths = np.array([len(token_lists[i]) for i in group])
            starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            if pooling == "mean":
                vectors += list(np.add.reduceat(rows, starts, axis=0) / lengths[:, None])
            else:
                vectors += np.split(rows, starts[1:])
    finally:
        ctx.set_embeddings(False)
    return vectors


def score_token_lists(ctx: Any, token_lists: Sequence[list[int]]) -> np.ndarray:
    """The classification head's scores [n_inputs, n_cls_out] for each input (its [CLS] row)."""
    if not is_reranker(ctx.model):
        raise ModelKindError(f"{ctx.model.path}: this model has no classification head (cls.output.weight): "
                                f"it cannot rerank; use a reranker such as a bge-reranker or a cross-encoder")
    rows = [_run(ctx, token_lists, group, "first") for group in _groups(token_lists, ctx.n_ubatch,
                                                                        ctx.memory.n_seq_max)]
    return np.concatenate(rows)


def pair_tokens(vocab: Any, query: str, document: str) -> list[int]:
    """[CLS] query [SEP] document [SEP]: the query with its special tokens, then the document and the
    closing [SEP] (a Hugging Face BERT pair's ids)."""
    tokens = vocab.tokenize(query, add_special=True) + vocab.tokenize(document, add_special=False)
    sep = vocab.special.sep if vocab.special.sep is not None else vocab.eos_id
    return tokens + ([sep] if sep is not None else [])


def rank_results(scores: np.ndarray, documents: Sequence[str], top_n: int | None,
                 return_documents: bool = True) -> list[dict[str, Any]]:
    """Results best first: {"index", "relevance_score"(, "document")}, the first top_n of them."""
    order = np.argsort(-scores, kind="stable")
    if top_n is not None:
        order = order[:top_n]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": int(i), "relevance_score": float(scores[i])}
        if return_documents:
            item["document"] = {"text": documents[i]}
        results.append(item)
    return results
