"""Mirostat 1 and 2: select tokens while steering the observed surprise (-log2 p) toward tau.

Both keep mu (the surprise budget, starting at 2 tau), draw from the truncated candidates with
std::mt19937 as llama.cpp does, and move mu by eta * (tau - observed surprise) after each draw.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ggflow.core.sampling import SamplerBase, TokenDataArray
from ggflow.samplers_builtin.rng import MT19937

if TYPE_CHECKING:
    from ggflow.core.sampling_params import SamplingParams

_F = np.float32


class _Mirostat(SamplerBase):
    selects = True

    def __init__(self, tau: float, eta: float, seed: int | None):
        self.tau, self.eta, self.seed = float(tau), float(eta), seed
        self.mu = _F(2.0 * self.tau)
        self._rng = MT19937(seed)

    def select_and_learn(self, cur: TokenDataArray) -> None:
        """Draw from the (already truncated, sorted) candidates and move mu toward the target."""
        probs = cur.softmax()
        idx = self._rng.discrete(probs)
        cur.selected = idx
        with np.errstate(divide="ignore"):
            surprise = -np.log2(probs[idx])
        self.mu = _F(self.mu - _F(self.eta) * (surprise - _F(self.tau)))

    def reset(self) -> None:
        self.mu = _F(2.0 * self.tau)
        self._rng.reseed()

    def clone(self) -> "_Mirostat":
        twin = super().clone()
        twin._rng = self._rng.clone()
        return twin


class Mirostat(_Mirostat):
    """Mirostat 1: estimate the Zipf exponent s from the top m candidates, then keep the top k that
    makes the expected surprise mu. ``n_vocab`` None uses the number of candidates it is given."""

    name = "mirostat"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "Mirostat | None":
        return cls(tau=params.mirostat_tau, eta=params.mirostat_eta, n_vocab=vocab_size, seed=params.seed)

    def __init__(self, tau: float = 5.0, eta: float = 0.1, m: int = 100, n_vocab: int | None = None,
                 seed: int | None = None):
        super().__init__(tau, eta, seed)
        self.m, self.n_vocab = int(m), n_vocab

    def zipf_exponent(self, top_probs: np.ndarray) -> np.float32:
        i = np.arange(len(top_probs) - 1, dtype=np.float32)
        t = np.log((i + 2) / (i + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.log(top_probs[:-1] / top_probs[1:])
        # running float32 sums, as llama.cpp accumulates them (numpy's pairwise sum can round differently)
        return _F(np.cumsum(t * b)[-1] / np.cumsum(t * t)[-1])

    def top_k_for_mu(self, s_hat: np.float32, n_vocab: int) -> float:
        eps = _F(s_hat - 1)
        with np.errstate(all="ignore"):
            k = np.power(_F(eps * np.power(_F(2), self.mu)) / _F(1 - np.power(_F(n_vocab), -eps)), _F(1) / s_hat)
        return float(k)

    def apply(self, cur: TokenDataArray) -> None:
        n = len(cur)
        if n == 0:
            return
        probs = cur.softmax()
        top = cur.top_positions(min(max(self.m, 2), n))
        k = self.top_k_for_mu(self.zipf_exponent(probs[top]), self.n_vocab or n) if n > 1 else 1.0
        k = min(max(int(k), 1), n) if np.isfinite(k) else n  # llama.cpp's int(k) of inf/nan is undefined
        cur.take(top[:k] if k <= len(top) else cur.top_positions(k), sorted=True)
        self.select_and_learn(cur)


class MirostatV2(_Mirostat):
    """Mirostat 2: keep the candidates whose surprise is at most mu (at least the best one)."""

    name = "mirostat_v2"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "MirostatV2 | None":
        return cls(tau=params.mirostat_tau, eta=params.mirostat_eta, seed=params.seed)

    def __init__(self, tau: float = 5.0, eta: float = 0.1, seed: int | None = None):
        super().__init__(tau, eta, seed)

    def apply(self, cur: TokenDataArray) -> None:
        if len(cur) == 0:
            return
        probs = cur.softmax()
        with np.errstate(divide="ignore"):
            within = np.flatnonzero(-np.log2(probs) <= self.mu)
        if len(within) == 0:
            within = np.array([int(np.argmax(cur.logits))])
        # surprise grows as the logit falls, so this set is the sorted prefix llama.cpp cuts
        cur.take(within[np.argsort(-cur.logits[within], kind="stable")], sorted=True)
        self.select_and_learn(cur)
