"""The random numbers llama.cpp's samplers draw: std::mt19937 and libstdc++'s distributions over it.

numpy's MT19937 seeded the legacy way is the same generator as ``std::mt19937(seed)``; the draws below
combine its 32-bit outputs as ``std::generate_canonical`` does, so a sampler given the seed llama.cpp
was given draws the same numbers.
"""
from __future__ import annotations

import os

import numpy as np

RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: draw a seed from the OS instead
_TWO32 = 4294967296.0


def resolve_seed(seed: int | None) -> int:
    """The seed to start from: as given (mod 2**32), or a fresh random one for None / -1 / 0xFFFFFFFF."""
    if seed is None or seed == -1 or (seed & 0xFFFFFFFF) == RANDOM_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return int(seed) & 0xFFFFFFFF


class MT19937:
    """std::mt19937 with the two uniform draws llama.cpp uses. ``seed`` None means random, as in llama.cpp."""

    def __init__(self, seed: int | None = None):
        self.seed = seed
        self._bits = np.random.MT19937()
        self.reseed()

    def reseed(self) -> None:
        """Back to the start: the given seed, or a new random one (llama.cpp's reset does the same)."""
        legacy = np.random.RandomState(resolve_seed(self.seed)).get_state(legacy=False)
        self._bits.state = {"bit_generator": "MT19937", "state": legacy["state"]}

    def uint32(self, n: int) -> np.ndarray:
        return self._bits.random_raw(n)

    def uniform_double(self) -> float:
        """std::uniform_real_distribution<double>(0, 1): generate_canonical<double, 53> takes two outputs."""
        lo, hi = self.uint32(2)
        r = (float(lo) + float(hi) * _TWO32) / (_TWO32 * _TWO32)
        return r if r < 1.0 else float(np.nextafter(1.0, 0.0))

    def uniform_float(self) -> float:
        """std::uniform_real_distribution<float>(0, 1): one output, rounded to float first."""
        r = np.float32(self.uint32(1)[0]) / np.float32(_TWO32)
        return float(r) if r < 1.0 else float(np.nextafter(np.float32(1.0), np.float32(0.0)))

    def discrete(self, probs: np.ndarray) -> int:
        """std::discrete_distribution over ``probs`` (llama_sample_dist): normalized cumulative sums, lower bound."""
        if len(probs) < 2:
            return 0  # libstdc++ returns 0 without drawing
        p = np.asarray(probs, dtype=np.float64)
        total = np.cumsum(p)[-1]  # std::accumulate: a running sum, not numpy's pairwise one
        cum = np.cumsum(p / total)
        cum[-1] = 1.0
        return int(np.searchsorted(cum, self.uniform_double(), side="left"))

    def clone(self) -> "MT19937":
        twin = MT19937.__new__(MT19937)
        twin.seed = self.seed
        twin._bits = np.random.MT19937()
        twin._bits.state = self._bits.state
        return twin
