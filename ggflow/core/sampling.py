"""The Sampler, which takes logits and returns a token: TokenDataArray, the Sampler protocol, SamplerChain.

As in llama.cpp, a sampler works in place on a candidate array: some samplers reshape it (drop
candidates, rescale logits, compute probabilities), a selecting sampler sets ``selected``. A chain
applies its samplers in order; the token is ``ids[selected]``. Samplers are plugins: ``make_sampler``
builds one by the name it was registered under.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, runtime_checkable

import numpy as np

from ggflow.errors import GGFlowError


@dataclass
class TokenDataArray:
    """Candidate tokens. ``selected`` is an index into these arrays (not a token id), or None."""

    ids: np.ndarray                  # (n,) int32 token ids
    logits: np.ndarray               # (n,) float32
    probs: np.ndarray | None = None  # (n,) float32, filled by samplers that normalize
    selected: int | None = None
    sorted: bool = False             # True when candidates are in descending logit order

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int32)
        self.logits = np.asarray(self.logits, dtype=np.float32)
        if self.probs is not None:
            self.probs = np.asarray(self.probs, dtype=np.float32)
        n = len(self.ids)
        if self.ids.ndim != 1 or self.logits.shape != (n,) or (self.probs is not None and self.probs.shape != (n,)):
            raise ValueError(f"TokenDataArray needs 1-d ids, logits (and probs) of one length; got "
                             f"{self.ids.shape}, {self.logits.shape}"
                             f"{'' if self.probs is None else ', ' + str(self.probs.shape)}")

    @classmethod
    def from_logits(cls, logits: np.ndarray) -> "TokenDataArray":
        """Every token of the vocabulary as a candidate, in id order (what a decode step produces)."""
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        return cls(np.arange(len(logits), dtype=np.int32), logits.copy())

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def selected_token(self) -> int:
        if self.selected is None:
            raise GGFlowError("no token was selected: end the sampler chain with a selecting sampler "
                              "(e.g. 'greedy' or 'dist')")
        return int(self.ids[self.selected])


@runtime_checkable
class Sampler(Protocol):
    name: str

    def apply(self, cur: TokenDataArray) -> None:
        """Reshape the candidates in place and/or set ``cur.selected``."""

    def accept(self, token: int) -> None:
        """Record the token that was finally chosen (for samplers with history, e.g. penalties)."""

    def reset(self) -> None:
        """Forget history, as at the start of a new sequence."""

    def clone(self) -> "Sampler":
        """An independent copy with the same parameters and state."""


class SamplerChain:
    """Samplers applied in order; itself a Sampler, so chains nest."""

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = ()):
        self.samplers: list[Sampler] = list(samplers)

    def add(self, sampler: Sampler) -> "SamplerChain":
        self.samplers.append(sampler)
        return self

    def apply(self, cur: TokenDataArray) -> None:
        for sampler in self.samplers:
            sampler.apply(cur)

    def accept(self, token: int) -> None:
        for sampler in self.samplers:
            sampler.accept(token)

    def reset(self) -> None:
        for sampler in self.samplers:
            sampler.reset()

    def clone(self) -> "SamplerChain":
        return SamplerChain(s.clone() for s in self.samplers)

    def sample(self, logits: np.ndarray) -> int:
        """One decode step's token from its logits; the chain accepts it (as llama_sampler_sample does)."""
        cur = TokenDataArray.from_logits(logits)
        self.apply(cur)
        token = cur.selected_token
        self.accept(token)
        return token

    def __len__(self) -> int:
        return len(self.samplers)

    def __repr__(self) -> str:
        return f"SamplerChain([{', '.join(s.name for s in self.samplers)}])"


def make_sampler(name: str, **params: Any) -> Sampler:
    """Build the sampler registered under ``name`` with its parameters (UnknownNameError lists the names)."""
    from ggflow.plugins.manager import get_plugin_manager

    factory = get_plugin_manager().samplers.get(name)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins and some callables have none: let the call decide
        signature = None
    if signature is not None:
        try:
            signature.bind(**params)
        except TypeError as exc:
            raise GGFlowError(f"sampler {name!r} does not take these parameters: {exc}; "
                              f"it takes {signature}") from None
    return factory(**params)


__all__ = ["TokenDataArray", "Sampler", "SamplerChain", "make_sampler"]
