"""The sampler chain, which takes logits and returns a token: TokenDataArray, the Sampler protocol, SamplerChain.

As in llama.cpp, a sampler works in place on a candidate array: some samplers reshape it (drop
candidates, rescale logits, compute probabilities), a selecting sampler sets ``selected``. A chain
applies its samplers in order; the token is ``ids[selected]``. Samplers are plugins: ``make_sampler``
builds one by the name it was registered under, and a sampler's ``from_params`` builds it from
``SamplingParams``.

The policy (``SamplingParams``, the default order, ``build_chain``) lives in core/sampling_params.py, above
this module; ``ggflow.core.sampling`` gives both's names (see docs/sampling.md).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

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

    # -- reshaping helpers shared by samplers: a few numpy calls each, no loop per candidate ----------
    def take(self, index: "np.ndarray | slice", *, sorted: bool | None = None) -> None:
        """Keep the candidates at ``index`` (positions or a slice), in that order."""
        self.ids = self.ids[index]
        self.logits = self.logits[index]
        if self.probs is not None:
            self.probs = self.probs[index]
        self.selected = None
        if sorted is not None:
            self.sorted = sorted

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` candidates (the ``size = n`` of llama.cpp's array)."""
        if n < len(self.ids):
            self.take(slice(0, n))

    def top_positions(self, k: int) -> np.ndarray:
        """Positions of the ``k`` highest logits, highest first, without sorting the whole array."""
        n = len(self.logits)
        k = min(k, n)
        if self.sorted:
            return np.arange(k)
        if k < n and self.logits.min() == -np.inf:
            # numpy's introselect slows 15x on many equal keys: partition the live (finite) ones only
            live = np.flatnonzero(self.logits != -np.inf)
            if len(live) >= k:
                part = live[np.argpartition(self.logits[live], len(live) - k)[len(live) - k:]]
            else:
                part = np.concatenate([live, np.flatnonzero(self.logits == -np.inf)[:k - len(live)]])
        elif k < n:
            part = np.argpartition(self.logits, n - k)[n - k:]
        else:
            part = np.arange(n)
        part.sort()  # equal logits then stay in position order, whatever order argpartition left them in
        return part[np.argsort(-self.logits[part], kind="stable")]

    def sort_top(self, k: int) -> None:
        """Keep only the ``k`` highest-logit candidates, in descending order (llama.cpp's partial sort)."""
        if self.sorted:
            self.truncate(k)
        else:
            self.take(self.top_positions(k), sorted=True)

    def softmax(self) -> np.ndarray:
        """Fill ``probs`` from the logits (max-shifted, as llama.cpp does) and return them."""
        logits = self.logits
        peak = logits[0] if self.sorted else logits.max()
        p = np.exp(logits - peak)
        p /= np.cumsum(p)[-1]  # a running float32 sum, as llama.cpp's softmax adds them up
        self.probs = p
        return p

    def find(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where distinct token ids are among the candidates: (positions, index into ``tokens``) of those present.

        A candidate array fresh from the logits has id i at position i, so that is tried first (as
        llama.cpp's logit-bias does); only the misses cost a scan of the candidates.
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = len(self.ids)
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        guess = np.where((tokens >= 0) & (tokens < n), tokens, 0)
        hit = (guess == tokens) & (self.ids[guess] == tokens)
        if hit.all():
            return guess, np.arange(len(tokens))
        missing = np.flatnonzero(~hit)
        by_id = np.argsort(tokens[missing])
        wanted = tokens[missing][by_id]
        found = np.flatnonzero(np.isin(self.ids, wanted))
        which = missing[by_id[np.searchsorted(wanted, self.ids[found])]]
        hits = np.flatnonzero(hit)
        return np.concatenate([guess[hits], found]), np.concatenate([hits, which])

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

    # Optional: ``selects = True`` says the sampler picks the token (build_chain then adds no dist).
    # Optional: ``params = (SamplerParam(...), ...)`` declares its parameters (names, types, ranges,
    # defaults): SamplingParams, the CLI and the server check values against it (core/sampling_stages.py).
    # Optional: a classmethod ``from_params(params, vocab_size, vocab) -> Sampler | None`` builds the
    # sampler from SamplingParams (None where they switch it off); build_chain calls it for a stage
    # named in ``params.samplers`` (or the default order). Without one, make_sampler(name) builds it.


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
    if getattr(factory, "params", None) is not None:   # a declaration: checked, its defaults filled in
        from ggflow.core.sampling_stages import check_sampler_params
        return factory(**check_sampler_params(name, params, fill_defaults=True))
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


class SamplerBase:
    """Convenience base for samplers: no history (accept/reset do nothing); clone copies the instance's
    attributes (a shallow copy: a sampler with mutable state overrides clone).

    Set ``selects = True`` on a sampler that picks the token itself (as greedy and dist do), so
    ``build_chain`` ends the chain with it instead of adding ``dist``.
    """

    name = "base"
    selects = False

    def apply(self, cur: TokenDataArray) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def clone(self) -> "SamplerBase":
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


class LogitsProcessorSampler(SamplerBase):
    """A ``(token_ids, logits) -> logits`` function (as transformers' logits processors are) as a Sampler.

    The function sees the tokens accepted so far and logits indexed by token id (tokens that are no
    longer candidates are -inf); it returns new logits of the same shape. A -inf it returns masks the token.
    """

    name = "logits_processor"

    def __init__(self, fn: Callable[[list[int], np.ndarray], np.ndarray]):
        if not callable(fn):
            raise GGFlowError(f"logits_processor needs a callable (token_ids, logits) -> logits, got {fn!r}")
        self.fn = fn
        self.history: list[int] = []

    def apply(self, cur: TokenDataArray) -> None:
        if len(cur) == 0:
            return
        dense = np.full(int(cur.ids.max()) + 1, -np.inf, dtype=np.float32)
        dense[cur.ids] = cur.logits
        out = np.asarray(self.fn(list(self.history), dense), dtype=np.float32)
        if out.shape != dense.shape:
            raise GGFlowError(f"logits processor {self.fn!r} returned shape {out.shape}, expected {dense.shape}")
        kept = out[cur.ids]
        if np.isnan(kept).any() or not (kept > -np.inf).any():   # else the chain would pick token 0 of nothing
            raise GGFlowError(f"logits processor {self.fn!r} returned "
                              f"{'NaN logits' if np.isnan(kept).any() else 'no token with a logit above -inf'}: "
                              "no token can be sampled")
        cur.logits = kept
        cur.probs = None
        cur.sorted = False

    def accept(self, token: int) -> None:
        self.history.append(int(token))

    def reset(self) -> None:
        self.history.clear()

    def clone(self) -> "LogitsProcessorSampler":
        twin = LogitsProcessorSampler(self.fn)
        twin.history = list(self.history)
        return twin


__all__ = ["TokenDataArray", "Sampler", "SamplerBase", "SamplerChain", "make_sampler", "LogitsProcessorSampler"]
