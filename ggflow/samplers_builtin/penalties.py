"""Repetition samplers with history: penalties (repeat / frequency / presence) and DRY."""
from __future__ import annotations

import math
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from numba import njit

from ggflow.core.sampling import SamplerBase, TokenDataArray
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.core.sampling_params import SamplingParams


class _History(SamplerBase):
    """The last ``last_n`` accepted tokens (-1: all of them; 0: none are kept)."""

    enabled = True  # subclasses: False when their parameters make them no-ops (then nothing is recorded)

    def __init__(self, last_n: int):
        self.last_n = int(last_n)
        self._history: deque[int] = deque(maxlen=None if self.last_n < 0 else self.last_n)

    def accept(self, token: int) -> None:
        if self.last_n != 0 and self.enabled:
            self._history.append(int(token))

    def reset(self) -> None:
        self._history.clear()

    def clone(self) -> "_History":
        twin = super().clone()
        twin._history = deque(self._history, maxlen=self._history.maxlen)
        return twin

    @property
    def history(self) -> list[int]:
        return list(self._history)


class Penalties(_History):
    """Over the last n accepted tokens: a seen token's logit is divided by ``repeat`` (multiplied when
    it is <= 0), then lowered by ``frequency`` per occurrence and by ``presence`` once."""

    name = "penalties"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "Penalties | None":
        off = params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0
        if params.repeat_last_n == 0 or off:
            return None
        return cls(last_n=params.repeat_last_n, repeat=params.repeat_penalty, frequency=params.frequency_penalty,
                   presence=params.presence_penalty)

    def __init__(self, last_n: int = 64, repeat: float = 1.0, frequency: float = 0.0, presence: float = 0.0):
        if not (math.isfinite(repeat) and repeat > 0 and math.isfinite(1.0 / repeat)):
            raise GGFlowError(f"penalties: repeat must be finite and greater than 0, got {repeat}")
        if not (math.isfinite(frequency) and math.isfinite(presence)):
            raise GGFlowError(f"penalties: frequency and presence must be finite, got {frequency}, {presence}")
        super().__init__(last_n)
        self.repeat, self.frequency, self.presence = float(repeat), float(frequency), float(presence)

    @property
    def enabled(self) -> bool:
        return self.last_n != 0 and not (self.repeat == 1.0 and self.frequency == 0.0 and self.presence == 0.0)

    def apply(self, cur: TokenDataArray) -> None:
        if not self.enabled or not self._history:
            return
        tokens, counts = np.unique(np.fromiter(self._history, dtype=np.int64), return_counts=True)
        pos, which = cur.find(tokens)
        if len(pos) == 0:
            return
        f32 = np.float32
        seen = cur.logits[pos]
        seen = np.where(seen <= 0, seen * f32(self.repeat), seen / f32(self.repeat))
        seen -= counts[which].astype(f32) * f32(self.frequency) + f32(self.presence)
        cur.logits[pos] = seen
        cur.sorted = False


# -- DRY ---------------------------------------------------------------------------------------------

_MAX_BREAKER_CHARS = 40   # llama.cpp truncates a breaker string to this many bytes
_MAX_BREAKER_TAIL = 20    # and the token sequences that complete one to this many tokens
_FLOAT_MAX_LOG = 88.7228391


@njit(cache=True)
def _restart_limit(recent, n, heads, tail_starts, tail_lens, tails):
    """How far back a repeat may reach: up to the most recent complete sequence breaker."""
    for i in range(n):
        lo = np.searchsorted(heads, recent[i], side="left")
        hi = np.searchsorted(heads, recent[i], side="right")
        longest = -1
        for b in range(lo, hi):
            length = tail_lens[b]
            if length > longest and length <= i:
                match = True
                for off in range(length):
                    if tails[tail_starts[b] + off] != recent[i - off - 1]:
                        match = False
                        break
                if match:
                    longest = length
        if longest >= 0:
            return i - longest
    return n


@njit(cache=True)
def _repeat_counts(recent, n, rep_limit):
    """Z-algorithm over the reversed history: counts[last - k] = length of the suffix also ending k back."""
    counts = np.zeros(n, dtype=np.int64)
    last = n - 1
    lt = 0
    rt = 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and recent[m] == recent[m + k]:
                m += 1
            counts[last - k] = min(m, rep_limit)
            if m > 0:
                lt = k
                rt = k + m - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if counts[last - p] < right_part_len:
                counts[last - k] = min(counts[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and recent[i] == recent[i - k]:
                    i += 1
                counts[last - k] = min(i - k, rep_limit)
                lt = k
                rt = i - 1
    return counts


@njit(cache=True)
def dry_continuations(recent, allowed_length, heads, tail_starts, tail_lens, tails):
    """Tokens that would extend a repeat, with the repeat's length (one entry per occurrence).

    ``recent`` is the history newest first; ``heads`` (sorted) / tails describe the sequence breakers.
    """
    n = len(recent)
    empty = np.zeros(0, dtype=np.int64)
    rep_limit = _restart_limit(recent, n, heads, tail_starts, tail_lens, tails)
    if rep_limit < allowed_length:
        return empty, empty
    counts = _repeat_counts(recent, n, rep_limit)
    tokens = np.empty(n, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    found = 0
    for i in range(n - 1):
        if counts[i] >= allowed_length:
            tokens[found] = recent[n - 2 - i]  # the token that followed this earlier occurrence
            lengths[found] = counts[i]
            found += 1
    return tokens[:found], lengths[:found]


class Breakers:
    """DRY's sequence breakers as sorted arrays: head token -> tail token sequence."""

    def __init__(self, sequences: Sequence[Sequence[int]]):
        seqs = sorted((int(s[0]), tuple(int(t) for t in s[1:])) for s in sequences if len(s))
        seqs = list(dict.fromkeys(seqs))
        self.heads = np.array([h for h, _ in seqs], dtype=np.int64)
        self.tail_lens = np.array([len(t) for _, t in seqs], dtype=np.int64)
        self.tail_starts = np.cumsum(self.tail_lens) - self.tail_lens
        self.tails = np.array([tok for _, t in seqs for tok in t], dtype=np.int64)
        self.single = np.unique(self.heads[self.tail_lens == 0])

    def __len__(self) -> int:
        return len(self.heads)


_vocab_breakers: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def breaker_sequences(text: str, vocab: Any) -> list[tuple[int, ...]]:
    """The token sequences that spell a breaker string (llama.cpp's get_overlapping_token_sequences).

    A token containing the whole string breaks by itself; a token ending in a prefix of it breaks
    when followed by the tokens of the rest. Needs ``vocab.n_vocab``, ``token_to_piece``, ``tokenize``.
    """
    try:
        cache = _vocab_breakers.setdefault(vocab, {})
    except TypeError:
        cache = {}
    if text in cache:
        return cache[text]
    target = text.encode("utf-8")[:_MAX_BREAKER_CHARS]
    pieces = cache.get(None)
    if pieces is None:
        pieces = cache[None] = [vocab.token_to_piece(i, True) for i in range(vocab.n_vocab)]
    found: dict[tuple[int, ...], None] = {}
    first = target[:1]
    for tid, word in enumerate(pieces):
        if first not in word:
            continue
        if target in word:
            found[(tid,)] = None
            continue
        pos = word.find(first)
        while pos != -1:
            rest = word[pos:]
            if target.startswith(rest):
                tail = vocab.tokenize(target[len(rest):].decode("utf-8", "replace"), False, False)
                found[(tid, *tail[:_MAX_BREAKER_TAIL])] = None
            pos = word.find(first, pos + 1)
    cache[text] = list(found)
    return cache[text]


_dry_compiled = False


def _compile_dry_ahead(b: Breakers) -> None:
    """Compile (or load from numba's cache) DRY's kernel where the sampler is built, in the caller's thread:
    its first use would otherwise compile inside an engine step and stall every slot for seconds."""
    global _dry_compiled
    if not _dry_compiled:
        dry_continuations(np.zeros(4, np.int64), 1, b.heads, b.tail_starts, b.tail_lens, b.tails)
        _dry_compiled = True


class Dry(_History):
    """DRY ("don't repeat yourself"): a token that would extend a sequence already seen in the last n
    tokens, longer than ``allowed_length``, loses multiplier * base ** (length - allowed_length).

    ``sequence_breakers``: strings (need ``vocab``) or token id sequences; a repeat never reaches
    back past a breaker, and a single-token breaker is never penalized.
    """

    name = "dry"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "Dry | None":
        if params.dry_multiplier == 0.0 or params.dry_base < 1.0 or params.dry_penalty_last_n == 0:
            return None
        return cls(multiplier=params.dry_multiplier, base=params.dry_base, allowed_length=params.dry_allowed_length,
                   last_n=params.dry_penalty_last_n, sequence_breakers=list(params.dry_sequence_breakers), vocab=vocab)

    def __init__(self, multiplier: float = 0.0, base: float = 1.75, allowed_length: int = 2, last_n: int = 64,
                 sequence_breakers: Sequence[str | Sequence[int]] = (), vocab: Any = None):
        super().__init__(last_n)
        self.multiplier, self.base, self.allowed_length = float(multiplier), float(base), int(allowed_length)
        sequences: list[Sequence[int]] = []
        for breaker in sequence_breakers if self.enabled else ():
            if isinstance(breaker, str):
                if vocab is None:
                    raise GGFlowError(f"dry: sequence breaker {breaker!r} is text; turning it into tokens needs "
                                      "the vocabulary (pass vocab=..., or give token id sequences)")
                if breaker:
                    sequences.extend(breaker_sequences(breaker, vocab))
            else:
                sequences.append(breaker)
        self._breakers = Breakers(sequences)
        if self.enabled:
            _compile_dry_ahead(self._breakers)
        self.max_exponent = int(np.float32(_FLOAT_MAX_LOG) / np.log(np.float32(self.base))) \
            if self.base > 1.000001 else 0

    @property
    def enabled(self) -> bool:
        return self.multiplier != 0.0 and self.base >= 1.0 and self.last_n != 0

    def apply(self, cur: TokenDataArray) -> None:
        if not self.enabled or len(self._history) <= self.allowed_length:
            return
        recent = np.fromiter(reversed(self._history), dtype=np.int64)
        b = self._breakers
        tokens, lengths = dry_continuations(recent, self.allowed_length, b.heads, b.tail_starts, b.tail_lens, b.tails)
        if len(tokens) == 0:
            return
        order = np.lexsort((-lengths, tokens))  # per token, its longest repeat first
        tokens, lengths = tokens[order], lengths[order]
        first = np.concatenate([[True], tokens[1:] != tokens[:-1]])
        tokens, lengths = tokens[first], lengths[first]
        penalized = ~np.isin(tokens, b.single)
        tokens, lengths = tokens[penalized], lengths[penalized]
        pos, which = cur.find(tokens)
        if len(pos) == 0:
            return
        exponent = lengths[which] - self.allowed_length
        if self.max_exponent > 0:
            exponent = np.minimum(exponent, self.max_exponent)
        penalty = self.multiplier * np.power(np.float64(np.float32(self.base)), exponent)
        cur.logits[pos] = (cur.logits[pos] - penalty).astype(np.float32)
        cur.sorted = False
