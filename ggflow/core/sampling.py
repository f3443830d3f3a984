"""The Sampler, which takes logits and returns a token: TokenDataArray, the Sampler protocol, SamplerChain.

As in llama.cpp, a sampler works in place on a candidate array: some samplers reshape it (drop
candidates, rescale logits, compute probabilities), a selecting sampler sets ``selected``. A chain
applies its samplers in order; the token is ``ids[selected]``. Samplers are plugins: ``make_sampler``
builds one by the name it was registered under.

``SamplingParams`` bundles llama.cpp's sampling options with llama.cpp's defaults, and ``build_chain``
turns them into the chain llama.cpp's ``common_sampler`` builds (see docs/sampling.md).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

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
        cur.logits = out[cur.ids]
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


# -- SamplingParams and the default chain -----------------------------------------------------------

# llama.cpp's default order (common_params_sampling.samplers); a selecting sampler follows.
DEFAULT_SAMPLER_ORDER: tuple[str, ...] = (
    "penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temperature")

# llama.cpp's spellings of the stages (common_sampler_types_from_names) -> ours
_STAGE_ALIASES = {
    "typ_p": "typical", "typ": "typical", "typical_p": "typical", "nucleus": "top_p",
    "temp": "temperature", "temp_ext": "temperature",
}


@dataclass
class SamplingParams:
    """llama.cpp's sampling options (common_params_sampling), with its defaults. See docs/sampling.md."""

    temperature: float = 0.8          # <= 0: greedy
    top_k: int = 40                   # <= 0: off
    top_p: float = 0.95               # 1.0: off
    min_p: float = 0.05               # 0.0: off
    typical_p: float = 1.0            # 1.0: off
    min_keep: int = 0                 # truncating samplers keep at least this many (0 and 1 alike)
    dynatemp_range: float = 0.0       # 0.0: plain temperature; > 0: entropy-driven temp +/- range
    dynatemp_exponent: float = 1.0
    repeat_penalty: float = 1.0       # 1.0: off
    repeat_last_n: int = 64           # history the penalties look at; 0: off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0       # 0.0: DRY off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64      # -1: the whole history
    dry_sequence_breakers: Sequence[str | Sequence[int]] = ("\n", ":", "\"", "*")
    xtc_probability: float = 0.0      # 0.0: off
    xtc_threshold: float = 0.1        # > 0.5: off
    top_n_sigma: float = -1.0         # <= 0: off
    mirostat: int = 0                 # 0 off, 1 mirostat, 2 mirostat 2.0 (replace the truncation chain)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int | None = None           # None (or -1, 0xFFFFFFFF as in llama.cpp): a random seed
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    samplers: Sequence[str | tuple[str, Mapping[str, Any]]] | None = None  # stage order; None: the default

    def __post_init__(self) -> None:
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0
                and math.isfinite(1.0 / self.repeat_penalty)):
            raise GGFlowError(f"repeat_penalty must be finite and greater than 0, got {self.repeat_penalty}")
        for name in ("frequency_penalty", "presence_penalty", "temperature"):
            if not math.isfinite(getattr(self, name)):
                raise GGFlowError(f"{name} must be finite, got {getattr(self, name)}")
        if self.mirostat not in (0, 1, 2):
            raise GGFlowError(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat}")


def build_chain(params: SamplingParams | None = None, vocab_size: int | None = None,
                vocab: Any = None) -> SamplerChain:
    """The chain llama.cpp's common_sampler builds from these parameters.

    logit_bias (if any), then either temp + mirostat / mirostat_v2, or the stages of
    ``params.samplers`` (default: ``DEFAULT_SAMPLER_ORDER``) then dist. Temperature <= 0 makes the
    chain greedy: the stages run, the temperature stage is dropped and ``greedy`` selects. Stages whose
    parameters make them no-ops are left out (llama.cpp puts an empty placeholder there). Any other
    name in ``params.samplers`` (or ``(name, {param: value})``) is built with ``make_sampler``; if the
    last sampler built selects (``selects = True``) no dist is added. ``vocab`` is needed only to turn
    DRY's sequence breakers given as strings into tokens.
    """
    p = params if params is not None else SamplingParams()
    chain = SamplerChain()
    if p.logit_bias:
        chain.add(make_sampler("logit_bias", bias=dict(p.logit_bias), n_vocab=vocab_size))
    greedy = p.temperature <= 0
    if p.mirostat and not greedy:
        chain.add(make_sampler("temp", t=p.temperature))
        if p.mirostat == 1:
            chain.add(make_sampler("mirostat", tau=p.mirostat_tau, eta=p.mirostat_eta, m=100,
                                   n_vocab=vocab_size, seed=p.seed))
        else:
            chain.add(make_sampler("mirostat_v2", tau=p.mirostat_tau, eta=p.mirostat_eta, seed=p.seed))
        return chain
    for entry in (DEFAULT_SAMPLER_ORDER if p.samplers is None else p.samplers):
        sampler = _stage(entry, p, vocab, greedy)
        if sampler is not None:
            chain.add(sampler)
    if not (chain.samplers and getattr(chain.samplers[-1], "selects", False)):
        chain.add(make_sampler("greedy") if greedy else make_sampler("dist", seed=p.seed))
    return chain


def _stage(entry: str | tuple[str, Mapping[str, Any]], p: SamplingParams, vocab: Any,
           greedy: bool) -> Sampler | None:
    """One stage of the chain from the parameters; None where the parameters switch it off."""
    if not isinstance(entry, str):
        name, kwargs = entry
        return make_sampler(name, **dict(kwargs))
    name = _STAGE_ALIASES.get(entry.lower().replace("-", "_"), entry.lower().replace("-", "_"))
    keep = p.min_keep
    if name == "penalties":
        if p.repeat_last_n == 0 or (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0
                                    and p.presence_penalty == 0.0):
            return None
        return make_sampler("penalties", last_n=p.repeat_last_n, repeat=p.repeat_penalty,
                            frequency=p.frequency_penalty, presence=p.presence_penalty)
    if name == "dry":
        if p.dry_multiplier == 0.0 or p.dry_base < 1.0 or p.dry_penalty_last_n == 0:
            return None
        return make_sampler("dry", multiplier=p.dry_multiplier, base=p.dry_base,
                            allowed_length=p.dry_allowed_length, last_n=p.dry_penalty_last_n,
                            sequence_breakers=list(p.dry_sequence_breakers), vocab=vocab)
    if name == "top_n_sigma":
        return make_sampler("top_n_sigma", n=p.top_n_sigma) if p.top_n_sigma > 0 else None
    if name == "top_k":
        return make_sampler("top_k", k=p.top_k) if p.top_k > 0 else None
    if name == "typical":
        return make_sampler("typical", p=p.typical_p, min_keep=keep) if p.typical_p < 1.0 else None
    if name == "top_p":
        return make_sampler("top_p", p=p.top_p, min_keep=keep) if p.top_p < 1.0 else None
    if name == "min_p":
        return make_sampler("min_p", p=p.min_p, min_keep=keep) if p.min_p > 0.0 else None
    if name == "xtc":
        if p.xtc_probability <= 0.0 or p.xtc_threshold > 0.5:
            return None
        return make_sampler("xtc", probability=p.xtc_probability, threshold=p.xtc_threshold,
                            min_keep=keep, seed=p.seed)
    if name == "temperature":
        if greedy:
            return None
        return make_sampler("temp_ext", t=p.temperature, delta=p.dynatemp_range, exponent=p.dynatemp_exponent)
    if name == "greedy":
        return make_sampler("greedy")
    if name == "dist":
        return make_sampler("dist", seed=p.seed)
    return make_sampler(entry)


__all__ = ["TokenDataArray", "Sampler", "SamplerBase", "SamplerChain", "make_sampler", "LogitsProcessorSampler",
           "SamplingParams", "build_chain", "DEFAULT_SAMPLER_ORDER"]
