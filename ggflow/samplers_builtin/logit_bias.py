"""logit_bias: add a fixed amount to chosen tokens' logits (-inf bans a token)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from ggflow.core.sampling import SamplerBase, TokenDataArray
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.core.sampling_params import SamplingParams


class LogitBias(SamplerBase):
    """``bias``: {token id: amount} or (token id, amount) pairs; amounts for one token add up."""

    name = "logit_bias"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "LogitBias | None":
        return cls(bias=dict(params.logit_bias), n_vocab=vocab_size) if params.logit_bias else None

    def __init__(self, bias: Mapping[int, float] | Iterable[tuple[int, float]], n_vocab: int | None = None):
        pairs = list(bias.items()) if isinstance(bias, Mapping) else [tuple(p) for p in bias]
        raw_tokens = np.array([int(t) for t, _ in pairs], dtype=np.int64)
        raw_amounts = np.array([float(b) for _, b in pairs], dtype=np.float32)
        outside = raw_tokens < 0 if n_vocab is None else (raw_tokens < 0) | (raw_tokens >= n_vocab)
        bad = raw_tokens[outside]
        if len(bad):
            raise GGFlowError(f"logit_bias: token ids {bad.tolist()} are outside the vocabulary"
                              f"{'' if n_vocab is None else f' of {n_vocab} tokens'}")
        self.tokens, where = np.unique(raw_tokens, return_inverse=True)
        self.amounts = np.zeros(len(self.tokens), dtype=np.float32)
        np.add.at(self.amounts, where, raw_amounts)
        self.n_vocab = n_vocab

    def apply(self, cur: TokenDataArray) -> None:
        if len(self.tokens) == 0:
            return
        pos, which = cur.find(self.tokens)
        if len(pos):
            cur.logits[pos] += self.amounts[which]
            cur.sorted = False

    def __repr__(self) -> str:
        return f"LogitBias({dict(zip(self.tokens.tolist(), self.amounts.tolist()))})"
