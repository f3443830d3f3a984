"""Temperature: temp (logits / t) and temp_ext (dynamic temperature from the entropy, "dynatemp")."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ggflow.core.sampling import SamplerBase, TokenDataArray

if TYPE_CHECKING:
    from ggflow.core.sampling_params import SamplingParams


def scale_by_temperature(cur: TokenDataArray, t: float) -> None:
    """logits / t; t <= 0 keeps only the (first) highest logit and sets the rest to -inf; a t > 0 so small that
    the quotients overflow keeps every highest logit (the limit as t -> 0 of a draw)."""
    if len(cur) == 0:
        return
    if t <= 0.0:
        best = int(np.argmax(cur.logits))
        logits = np.full_like(cur.logits, -np.inf)
        logits[best] = cur.logits[best]
        cur.logits = logits
        return
    try:
        # no pass of its own to look for it: a quotient that overflows (or a t that is 0 as a float32) raises
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            cur.logits = cur.logits / np.float32(t)
    except FloatingPointError:
        # t so small that the logits lost their order: its limit, the highest logits (all of a tie)
        top = np.nanmax(cur.logits) if not np.isnan(cur.logits).all() else np.nan   # a NaN logit is not the top
        cur.logits = np.where(cur.logits == top, top, np.float32(-np.inf)).astype(np.float32)


class Temp(SamplerBase):
    name = "temp"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "Temp | None":
        return cls(t=params.temperature)

    def __init__(self, t: float):
        self.t = float(t)

    def apply(self, cur: TokenDataArray) -> None:
        scale_by_temperature(cur, self.t)


class TempExt(SamplerBase):
    """With delta > 0 the temperature moves within [t - delta, t + delta] with the normalized entropy
    of the candidates: t_dyn = t_min + (t_max - t_min) * (H / log n) ** exponent. Otherwise plain temp."""

    name = "temp_ext"

    @classmethod
    def from_params(cls, params: "SamplingParams", vocab_size: int | None = None,
                    vocab: Any = None) -> "TempExt | None":
        if params.greedy:  # greedy selects the top token: a temperature changes nothing
            return None
        return cls(t=params.temperature, delta=params.dynatemp_range, exponent=params.dynatemp_exponent)

    def __init__(self, t: float, delta: float = 0.0, exponent: float = 1.0):
        self.t, self.delta, self.exponent = float(t), float(delta), float(exponent)

    def dynamic_temperature(self, cur: TokenDataArray) -> float:
        n = len(cur)
        probs = cur.softmax()
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.cumsum(np.where(probs > 0, probs * np.log(probs), np.float32(0)))[-1]
        normalized = entropy / np.float32(-np.log(np.float32(1.0) / np.float32(n)))
        low, high = max(0.0, self.t - self.delta), self.t + self.delta
        return float(np.float32(low) + np.float32(high - low) * np.power(normalized, np.float32(self.exponent)))

    def apply(self, cur: TokenDataArray) -> None:
        if self.delta <= 0:
            scale_by_temperature(cur, self.t)
            return
        if len(cur) <= 1:
            return
        scale_by_temperature(cur, self.dynamic_temperature(cur))
        # llama.cpp renormalizes in double after scaling
        weights = np.exp(cur.logits.astype(np.float64) - float(cur.logits.max()))
        cur.probs = (weights / weights.sum()).astype(np.float32)
