"""Batch and UBatch: the tokens a decode call evaluates, and the pieces it is split into."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ggflow.errors import GGFlowError


class BatchError(GGFlowError, ValueError):
    """A batch that cannot be evaluated as given (bad ids, positions, sizes)."""


@dataclass
class Batch:
    tokens: np.ndarray    # int32 [n]
    pos: np.ndarray       # int32 [n]: position of each token in its sequence
    seq_id: np.ndarray    # int32 [n]: the sequence each token belongs to
    logits: np.ndarray    # bool [n]: whether to return logits for the token

    def __post_init__(self):
        self.tokens = np.ascontiguousarray(self.tokens, dtype=np.int32).reshape(-1)
        n = len(self.tokens)
        self.pos = np.ascontiguousarray(self.pos, dtype=np.int32).reshape(-1)
        self.seq_id = np.broadcast_to(np.asarray(self.seq_id, dtype=np.int32), (n,)).copy()
        self.logits = np.broadcast_to(np.asarray(self.logits, dtype=bool), (n,)).copy()
        if len(self.pos) != n:
            raise BatchError(f"batch has {n} tokens but {len(self.pos)} positions")

    @classmethod
    def from_tokens(cls, tokens: Sequence[int], pos0: int = 0, seq_id: int = 0,
                    all_logits: bool = False) -> "Batch":
        """A run of tokens of one sequence from position pos0; logits for the last (or all)."""
        n = len(tokens)
        logits = np.ones(n, bool) if all_logits else np.arange(n) == n - 1
        return cls(np.asarray(tokens), np.arange(pos0, pos0 + n), seq_id, logits)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def split(self, n_ubatch: int) -> Iterator["UBatch"]:
        for start in range(0, self.n_tokens, n_ubatch):
            sl = slice(start, start + n_ubatch)
            yield UBatch(self.tokens[sl], self.pos[sl], self.seq_id[sl], self.logits[sl])


@dataclass
class UBatch:
    """A slice of a batch small enough for one graph evaluation."""
    tokens: np.ndarray
    pos: np.ndarray
    seq_id: np.ndarray
    logits: np.ndarray

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return int(self.logits.sum())
