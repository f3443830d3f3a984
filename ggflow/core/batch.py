"""Batch and UBatch: the tokens a decode call evaluates, and the pieces it is split into."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ggflow.errors import GGFlowError


class BatchError(GGFlowError, ValueError):
    """A batch that cannot be evaluated as given (bad ids, positions, sizes)."""


INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def as_int32(values: object, what: str, lo: int = INT32_MIN) -> np.ndarray:
    """values as a flat int32 array, refusing first (naming the value as given) anything that is not an
    integer in [lo, INT32_MAX]: a cast first would evaluate token 2**32 + 5 as token 5."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu" and arr.size:
        arr = _exact_integers(values, what, lo)   # floats, bools, mixed or beyond-64-bit Python ints
    arr = arr.reshape(-1)
    if arr.size and (arr.dtype != np.int32 or lo > INT32_MIN) and (arr.min() < lo or arr.max() > INT32_MAX):
        bad = np.flatnonzero((arr < lo) | (arr > INT32_MAX))
        raise _out_of_range(what, arr[bad[0]], int(bad[0]), lo)
    return np.ascontiguousarray(arr, dtype=np.int32)


def sequences_of(seq_id: np.ndarray) -> np.ndarray:
    """The distinct sequence ids of a batch's tokens, in order: np.unique's, without its sort for one token
    (a decode step of one sequence)."""
    return seq_id[:1] if len(seq_id) == 1 else np.unique(seq_id)


def _exact_integers(values: object, what: str, lo: int) -> np.ndarray:
    items = np.asarray(values, dtype=object).reshape(-1)
    out = []
    for i, x in enumerate(items):   # only for input that is not an integer array already
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise BatchError(f"{what} {x!r} at batch index {i} is not an integer")
        if not lo <= int(x) <= INT32_MAX:   # report before numpy refuses what does not fit 64 bits
            raise _out_of_range(what, int(x), i, lo)
        out.append(int(x))
    return np.asarray(out, dtype=np.int64)


def _out_of_range(what: str, value: object, index: int, lo: int) -> BatchError:
    return BatchError(f"{what} {value} at batch index {index} is outside [{lo}, {INT32_MAX}]")


def _per_token(values: np.ndarray, n: int) -> np.ndarray:
    """A new array of n: values broadcast (one for every token, or one each; numpy refuses other shapes)."""
    if values.shape == (n,):
        return values.copy()
    if values.size == 1:
        return np.full(n, values.reshape(-1)[0], values.dtype)
    return np.broadcast_to(values, (n,)).copy()


@dataclass
class Batch:
    tokens: np.ndarray    # int32 [n]
    pos: np.ndarray       # int32 [n]: position of each token in its sequence
    seq_id: np.ndarray    # int32 [n]: the sequence each token belongs to
    logits: np.ndarray    # bool [n]: whether to return logits for the token

    def __post_init__(self):
        # a negative id survives the cast as itself; Context refuses it with the vocabulary's range
        self.tokens = as_int32(self.tokens, "token id")
        n = len(self.tokens)
        self.pos = as_int32(self.pos, "position")
        self.seq_id = _per_token(as_int32(self.seq_id, "sequence id").reshape(np.shape(self.seq_id)), n)
        self.logits = _per_token(np.asarray(self.logits, dtype=bool), n)
        if len(self.pos) != n:
            raise BatchError(f"batch has {n} tokens but {len(self.pos)} positions")

    @classmethod
    def from_tokens(cls, tokens: Sequence[int], pos0: int = 0, seq_id: int = 0,
                    all_logits: bool = False) -> "Batch":
        """A run of tokens of one sequence from position pos0; logits for the last (or all)."""
        n = len(tokens)
        logits = np.ones(n, bool) if all_logits else np.arange(n) == n - 1
        # not np.asarray(tokens): numpy turns [1, -1, 2**63] into floats, and the ids must be checked as given
        return cls(tokens if isinstance(tokens, np.ndarray) else list(tokens), np.arange(pos0, pos0 + n), seq_id,
                   logits)

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
