"""Samplers that drop candidates: top_k, top_p, min_p, typical, top_n_sigma, xtc (llama.cpp's semantics).

None of them sorts the whole vocabulary unless it has to: top_k partitions, and top_p / typical
sort a few hundred of the best candidates first and look further only when those don't reach p
(llama.cpp's top_p does the same with its top-256 try).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ggflow.core.sampling import SamplerBase, TokenDataArray
from ggflow.samplers_builtin.rng import MT19937

if TYPE_CHECKING:
    from ggflow.core.sampling_params import SamplingParams

_FIRST_TRY = 256      # candidates sorted before looking further
_LARGE = 1024         # below this many candidates, sort them all at once (as llama.cpp does)


def smallest_first(key: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k smallest keys, ascending; ties in position order."""
    n = len(key)
    part = np.argpartition(key, k - 1)[:k] if k < n else np.arange(n)
    return part[np.argsort(key[part], kind="stable")]


def shortest_prefix(key: np.ndarray | None, probs: np.ndarray, p: float, min_keep: int,
                    strict: bool) -> np.ndarray:
    """Positions, in ``key`` order (None: already in order), of the shortest prefix whose cumulative
    probability reaches p (``>`` when strict, else ``>=``), and at least min_keep long."""
    n = len(probs)
    threshold = np.float32(p)
    k = n if key is None or n <= _LARGE else _FIRST_TRY
    while True:
        order = np.arange(n) if key is None else smallest_first(key, k)
        cum = np.cumsum(probs[order])  # float32, sequential: as llama.cpp accumulates
        first = int(np.searchsorted(cum, threshold, side="right" if strict else "left"))
        last = max(first + 1, min_keep)
        if last <= k or k == n:
            return order[:min(last, n)]
        k = min(n, k * 16)


class TopK(SamplerBase):
    """The k highest logits, sorted; k <= 0 keeps everything."""

    name = "top_k"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "TopK | None":
        return cls(k=params.top_k) if params.top_k > 0 else None

    def __init__(self, k: int):
        self.k = int(k)

    def apply(self, cur: TokenDataArray) -> None:
        if self.k > 0 and len(cur):
            cur.sort_top(self.k)


class _ProbabilityCut(SamplerBase):
    """A cut set by one probability p (a SamplingParams field) that keeps at least min_keep candidates;
    ``from_params`` leaves it out of the chain when p is at its "off" value."""

    param: str          # the SamplingParams field holding p

    @classmethod
    def is_on(cls, p: float) -> bool:
        return p < 1.0

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "_ProbabilityCut | None":
        p = getattr(params, cls.param)
        return cls(p=p, min_keep=params.min_keep) if cls.is_on(p) else None

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = float(p), int(min_keep)


class TopP(_ProbabilityCut):
    """Nucleus: the most probable candidates whose probabilities add up to at least p (p >= 1: off)."""

    name = "top_p"
    param = "top_p"

    def apply(self, cur: TokenDataArray) -> None:
        if self.p >= 1.0 or len(cur) == 0:
            return
        probs = cur.softmax()
        key = None if cur.sorted else -cur.logits
        cur.take(shortest_prefix(key, probs, self.p, self.min_keep, strict=False), sorted=True)


class MinP(_ProbabilityCut):
    """Candidates whose probability is at least p times the top one's: logit >= max + log(p)."""

    name = "min_p"
    param = "min_p"

    @classmethod
    def is_on(cls, p: float) -> bool:
        return p > 0.0

    def apply(self, cur: TokenDataArray) -> None:
        n = len(cur)
        if self.p <= 0.0 or n == 0:
            return
        peak = cur.logits[0] if cur.sorted else cur.logits.max()
        with np.errstate(divide="ignore"):   # a p that is 0 as a float32: log -inf, every candidate kept
            floor = np.float32(peak) + np.log(np.float32(self.p))
        keep = cur.logits >= floor
        count = int(np.count_nonzero(keep))
        if count >= max(self.min_keep, 1):
            if count < n:
                cur.take(keep if not cur.sorted else slice(0, count))
            return
        cur.sort_top(min(max(self.min_keep, 1), n))  # too few pass: the min_keep best


class Typical(_ProbabilityCut):
    """Locally typical sampling: candidates whose surprise is closest to the entropy, up to mass p."""

    name = "typical"
    param = "typical_p"

    def apply(self, cur: TokenDataArray) -> None:
        if self.p >= 1.0 or len(cur) == 0:
            return
        probs = cur.softmax()
        with np.errstate(divide="ignore", invalid="ignore"):
            surprise = -np.log(probs)
            entropy = np.cumsum(np.where(probs > 0, probs * surprise, np.float32(0)))[-1]  # llama.cpp's running sum
            shifted = np.abs(surprise - entropy)  # a zero-probability candidate: inf, last
        cur.take(shortest_prefix(shifted, probs, self.p, self.min_keep, strict=True), sorted=False)


class TopNSigma(SamplerBase):
    """Masks (logit -> -inf) candidates more than n standard deviations of the logits below the max."""

    name = "top_n_sigma"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "TopNSigma | None":
        return cls(n=params.top_n_sigma) if params.top_n_sigma > 0 else None

    def __init__(self, n: float):
        self.n = float(n)

    def apply(self, cur: TokenDataArray) -> None:
        if self.n <= 0.0 or len(cur) <= 1:
            return
        logits = cur.logits
        finite = logits != -np.inf
        count = int(np.count_nonzero(finite))
        if count == 0:
            return
        live = logits[finite] if count < len(logits) else logits
        peak = max(logits[0], live.max())
        mean = live.sum(dtype=np.float64) / count
        std = np.float32(np.sqrt(np.square(live - mean, dtype=np.float64).sum() / count))
        cut = logits < peak - np.float32(self.n) * std
        if cut.any():
            cur.logits = np.where(cut, np.float32(-np.inf), logits)


class XTC(SamplerBase):
    """Exclude Top Choices: with the given probability, drop every candidate at or above the threshold
    probability except the least likely of them (nothing happens if fewer than two reach it)."""

    name = "xtc"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "XTC | None":
        if params.xtc_probability <= 0.0 or params.xtc_threshold > 0.5:
            return None
        return cls(probability=params.xtc_probability, threshold=params.xtc_threshold, min_keep=params.min_keep,
                   seed=params.seed)

    def __init__(self, probability: float, threshold: float = 0.1, min_keep: int = 1, seed: int | None = None):
        self.probability, self.threshold = float(probability), float(threshold)
        self.min_keep, self.seed = int(min_keep), seed
        self._rng = MT19937(seed)

    def apply(self, cur: TokenDataArray) -> None:
        n = len(cur)
        if self.probability <= 0.0 or self.threshold > 0.5 or n < 2:
            return
        if self._rng.uniform_float() > self.probability:
            return
        probs = cur.softmax()
        above = np.flatnonzero(probs >= np.float32(self.threshold))
        drop = len(above) - 1
        if drop <= 0 or n - drop < self.min_keep:
            return
        if cur.sorted:
            cur.take(slice(drop, None))
            return
        best_first = above[np.argsort(-cur.logits[above], kind="stable")]
        keep = np.ones(n, dtype=bool)
        keep[best_first[:drop]] = False
        cur.take(keep)

    def reset(self) -> None:
        self._rng.reseed()

    def clone(self) -> "XTC":
        twin = super().clone()
        twin._rng = self._rng.clone()
        return twin
