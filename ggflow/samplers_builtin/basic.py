"""The selecting samplers: greedy (argmax) and dist (draw from the softmax with a seeded RNG)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ggflow.core.sampling import SamplerBase, TokenDataArray
from ggflow.samplers_builtin.rng import MT19937

if TYPE_CHECKING:
    from ggflow.core.sampling_params import SamplingParams


class Greedy(SamplerBase):
    """The highest logit; the first of equals."""

    name = "greedy"
    selects = True

    def apply(self, cur: TokenDataArray) -> None:
        if len(cur):
            cur.selected = int(np.argmax(cur.logits))


class Dist(SamplerBase):
    """Draws a candidate with probability softmax(logits), from std::mt19937(seed) as llama.cpp does.

    The draw is one uniform double u; the token is the first whose running sum of exp(logit - max)
    reaches u times the total. ``probs`` are left normalized. ``seed`` None is a random seed.
    """

    name = "dist"
    selects = True

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "Dist | None":
        return cls(seed=params.seed)

    def __init__(self, seed: int | None = None):
        self.seed = seed
        self._rng = MT19937(seed)

    def apply(self, cur: TokenDataArray) -> None:
        n = len(cur)
        if n == 0:
            cur.selected = None
            return
        if n == 1:
            self._rng.uniform_double()  # llama.cpp draws even here, keeping its RNG in step
            cur.probs = np.ones(1, dtype=np.float32)
            cur.selected = 0
            return
        peak = cur.logits[0] if cur.sorted else cur.logits.max()
        if np.isposinf(peak):   # logits at +inf (a logit bias): exp(inf - inf) is NaN, they share the draw
            weights = (cur.logits == peak).astype(np.float32)
        else:
            weights = np.exp(cur.logits - peak)
        running = np.cumsum(weights, dtype=np.float64)  # sequential, in double, as llama.cpp sums
        total = running[-1]
        target = total * self._rng.uniform_double()
        cur.selected = min(int(np.searchsorted(running, target, side="left")), n - 1)
        cur.probs = (weights / total).astype(np.float32)

    def reset(self) -> None:
        self._rng.reseed()

    def clone(self) -> "Dist":
        twin = Dist.__new__(Dist)
        twin.seed, twin._rng = self.seed, self._rng.clone()
        return twin

    def __repr__(self) -> str:
        return f"Dist(seed={self.seed!r})"
