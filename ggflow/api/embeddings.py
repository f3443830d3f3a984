"""llama-cpp-python's embeddings on LLM: ``embed`` (vectors) and ``create_embedding`` (OpenAI's list shape).

An embedding is the model's final hidden state after the output norm (llama.cpp's ``t_embd``: what lm_head
would turn into logits), per token, pooled as the model's ``{arch}.pooling_type`` says or as LLM(pooling_type=)
asks: none (one vector per token), mean, cls (the first token's) or last (the last token's). Each input is
evaluated alone, from position 0; the cache's earlier contents are dropped (as llama-cpp-python clears it).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ggflow.api import arguments as A
from ggflow.api import shapes
from ggflow.api.encoder import embed_token_lists, fit_tokens, is_encoder, max_input_tokens
from ggflow.errors import ArgumentError

POOLING_TYPES = ("none", "mean", "cls", "last")   # llama.cpp's LLAMA_POOLING_TYPE_NONE .. LAST (0 .. 3)


def check_pooling_type(value: Any) -> str | None:
    """None: the model's; otherwise a name (or llama.cpp's number, 0..3)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(POOLING_TYPES):
        return POOLING_TYPES[value]
    if value in POOLING_TYPES:
        return value
    raise ArgumentError("pooling_type", value, f"None (the model's) or one of {', '.join(POOLING_TYPES)}")


def model_pooling_type(metadata: Any) -> str:
    """The GGUF's ``{arch}.pooling_type`` (a causal LM has none: per-token vectors)."""
    value = metadata.arch_get("pooling_type", 0)
    return POOLING_TYPES[int(value)] if 0 <= int(value) < len(POOLING_TYPES) else "none"


def pool(hidden: np.ndarray, kind: str) -> np.ndarray:
    """[n_tokens, n_embd] -> [n_embd] (mean, cls, last) or itself (none)."""
    if kind == "mean":
        return hidden.mean(axis=0)
    if kind == "cls":
        return hidden[0]
    if kind == "last":
        return hidden[-1]
    return hidden


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """L2-normalize along the last axis (a zero vector stays zero), as llama-cpp-python's normalize_embedding."""
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.where(norm > 0, vectors / np.where(norm > 0, norm, 1), vectors)


class EmbeddingMixin:
    pooling_type: str | None

    def embed(self, input: "str | list[str]", normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """One embedding (a list of floats; a list of them per token with pooling "none") per input string."""
        inputs = [input] if isinstance(input, str) else input
        if not isinstance(inputs, (list, tuple)) or not inputs or not all(isinstance(s, str) for s in inputs):
            raise ArgumentError("input", input, "a string or a non-empty list of strings")
        do_normalize = A.check_bool("normalize", normalize)
        truncate = A.check_bool("truncate", truncate)
        A.check_bool("return_count", return_count)
        self._require_context()
        kind = self.pooling_type or model_pooling_type(self.model.metadata)
        encoder = is_encoder(self.model)   # inputs batched per ubatch, cut keeping their closing [SEP]
        n_ctx = max_input_tokens(self.context) if encoder else self.n_ctx()
        token_lists = []
        for i, text in enumerate(inputs):
            tokens = self.tokenize(text, add_bos=True, special=False)
            if encoder:
                tokens = fit_tokens(tokens, n_ctx, truncate, f"input[{i}]", keep_last=True)
            elif len(tokens) > n_ctx:
                if not truncate:
                    raise ArgumentError(f"input[{i}]", text[:40], f"at most {n_ctx} tokens (or truncate=True); "
                                                                  f"it has {len(tokens)}")
                tokens = tokens[:n_ctx]
            if not tokens:
                raise ArgumentError(f"input[{i}]", text, "a text with at least one token")
            token_lists.append(tokens)
        with self._lock.turn():
            if encoder:
                pooled = embed_token_lists(self.context, token_lists, kind)
            else:
                pooled = [pool(self._hidden_states(tokens), kind) for tokens in token_lists]
            vectors = [(l2_normalize(v) if do_normalize else v).tolist() for v in pooled]
        output = vectors[0] if isinstance(input, str) else vectors
        n_tokens = sum(len(t) for t in token_lists)
        return (output, n_tokens) if return_count else output

    def create_embedding(self, input: "str | list[str]", model: str | None = None) -> dict[str, Any]:
        """OpenAI's embeddings response: {"object": "list", "data": [{"object": "embedding", ...}], ...}."""
        vectors, n_tokens = self.embed(input, return_count=True)
        if isinstance(input, str):
            vectors = [vectors]
        return shapes.embedding_list(model or self.model_path, vectors, n_tokens)

