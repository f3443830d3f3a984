"""Sampling policy: ``SamplingParams`` (llama.cpp's options with llama.cpp's defaults) and ``build_chain``.

The samplers themselves are machinery (core/sampling.py) and plugins (samplers_builtin/). This module
only decides which of them run and in what order, as llama.cpp's ``common_sampler`` does; each sampler
reads its own options from the params (``from_params``), so a plugin's sampler takes part the same
way a built-in does. See docs/sampling.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ggflow.core.sampler_chain import Sampler, SamplerChain, make_sampler
from ggflow.core.sampling_stages import STAGE_ALIASES as _STAGE_ALIASES, sampler_stages
from ggflow.errors import GGFlowError

# llama.cpp's default order (common_params_sampling.samplers); a selecting sampler follows.
DEFAULT_SAMPLER_ORDER: tuple[str, ...] = (
    "penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temperature")


# mirostat's value -> the sampler that replaces the truncation stages
_MIROSTAT_SAMPLERS = {1: "mirostat", 2: "mirostat_v2"}


def _option(default: Any = None, doc: str = "", *, factory: Any = None) -> Any:
    """A SamplingParams field whose ``doc`` says what its values mean (the CLI's help reads it)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass
class SamplingParams:
    """llama.cpp's sampling options (common_params_sampling), with its defaults. See docs/sampling.md."""

    temperature: float = _option(0.8, "temperature; <= 0 is greedy")
    top_k: int = _option(40, "keep the k most likely tokens; <= 0: off")
    top_p: float = _option(0.95, "nucleus: keep the most likely tokens up to this mass; 1.0: off")
    min_p: float = _option(0.05, "drop tokens below this fraction of the top probability; 0.0: off")
    typical_p: float = _option(1.0, "locally typical sampling; 1.0: off")
    min_keep: int = _option(0, "truncating samplers keep at least this many (0 and 1 alike)")
    dynatemp_range: float = _option(0.0, "0.0: plain temperature; > 0: entropy-driven temperature +/- range")
    dynatemp_exponent: float = _option(1.0, "dynamic temperature exponent")
    repeat_penalty: float = _option(1.0, "penalize repeated tokens; 1.0: off")
    repeat_last_n: int = _option(64, "tokens of history the penalties look at; 0: off")
    frequency_penalty: float = _option(0.0, "subtracted per occurrence in the history; 0.0: off")
    presence_penalty: float = _option(0.0, "subtracted once for tokens in the history; 0.0: off")
    dry_multiplier: float = _option(0.0, "DRY repetition penalty strength; 0.0: off")
    dry_base: float = _option(1.75, "DRY penalty base")
    dry_allowed_length: int = _option(2, "repeats up to this length are not penalized by DRY")
    dry_penalty_last_n: int = _option(64, "history DRY looks at; -1: the whole history")
    dry_sequence_breakers: Sequence[str | Sequence[int]] = _option(
        ("\n", ":", "\"", "*"), "strings (or token sequences) that end DRY's repeat matching")
    xtc_probability: float = _option(0.0, "chance of excluding the top choices (XTC); 0.0: off")
    xtc_threshold: float = _option(0.1, "XTC excludes tokens above this probability; > 0.5: off")
    top_n_sigma: float = _option(-1.0, "keep tokens within n standard deviations of the top logit; <= 0: off")
    mirostat: int = _option(0, "0 off, 1 mirostat, 2 mirostat 2.0 (replaces the truncation stages)")
    mirostat_tau: float = _option(5.0, "mirostat target entropy")
    mirostat_eta: float = _option(0.1, "mirostat learning rate")
    seed: int | None = _option(None, "RNG seed; None (or -1, 0xFFFFFFFF as in llama.cpp): random")
    logit_bias: Mapping[int, float] = _option(doc="token id -> added to its logit", factory=dict)
    samplers: Sequence[str | tuple[str, Mapping[str, Any]]] | None = _option(
        None, "stage order (names, (name, {param: value}) or 'name:param=value'); None: the default order")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0
                and math.isfinite(1.0 / self.repeat_penalty)):
            raise GGFlowError(f"repeat_penalty must be finite and greater than 0, got {self.repeat_penalty}")
        for name in ("frequency_penalty", "presence_penalty", "temperature"):
            if not math.isfinite(getattr(self, name)):
                raise GGFlowError(f"{name} must be finite, got {getattr(self, name)}")
        if self.mirostat not in (0, 1, 2):
            raise GGFlowError(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat}")
        if self.samplers is not None:
            # names and parameters checked against each sampler's declaration (core/sampling_stages.py)
            self.samplers = sampler_stages(self.samplers)

    @property
    def greedy(self) -> bool:
        """Temperature <= 0: the chain picks the most likely token (no temperature stage, no dist)."""
        return self.temperature <= 0


def build_chain(params: SamplingParams | None = None, vocab_size: int | None = None,
                vocab: Any = None) -> SamplerChain:
    """The chain llama.cpp's common_sampler builds from these parameters.

    logit_bias (if any), then either temp + mirostat / mirostat_v2, or the stages of
    ``params.samplers`` (default: ``DEFAULT_SAMPLER_ORDER``) then dist. Temperature <= 0 makes the
    chain greedy: the stages run, the temperature stage leaves itself out and ``greedy`` selects. Each
    stage is built by its sampler's ``from_params``, which leaves it out (None) where the parameters
    make it a no-op (llama.cpp puts an empty placeholder there). ``(name, {param: value})`` entries are
    built with ``make_sampler``. If the last sampler built selects (``selects = True``) no dist is
    added. ``vocab`` is needed only to turn DRY's sequence breakers given as strings into tokens.
    """
    p = params if params is not None else SamplingParams()
    chain = SamplerChain()

    def add(name: str) -> None:
        sampler = sampler_from_params(name, p, vocab_size, vocab)
        if sampler is not None:
            chain.add(sampler)

    add("logit_bias")
    if p.mirostat and not p.greedy:
        add("temp")
        add(_MIROSTAT_SAMPLERS[p.mirostat])
        return chain
    for entry in (DEFAULT_SAMPLER_ORDER if p.samplers is None else p.samplers):
        if isinstance(entry, str):
            add(_stage_name(entry))
        else:
            name, kwargs = entry
            chain.add(make_sampler(name, **dict(kwargs)))
    if not (chain.samplers and getattr(chain.samplers[-1], "selects", False)):
        add("greedy" if p.greedy else "dist")
    return chain


def sampler_from_params(name: str, params: SamplingParams, vocab_size: int | None = None,
                        vocab: Any = None) -> Sampler | None:
    """The sampler registered as ``name``, configured by ``params`` (None: the params switch it off).

    A factory with a ``from_params`` classmethod reads its own options; one without is built with no
    parameters by ``make_sampler`` (which says which ones it would need).
    """
    from ggflow.plugins.manager import get_plugin_manager

    from_params = getattr(get_plugin_manager().samplers.get(name), "from_params", None)
    return make_sampler(name) if from_params is None else from_params(params, vocab_size, vocab)


def _stage_name(entry: str) -> str:
    """A stage's registered name, from llama.cpp's spellings (``min-p``, ``temp``, ``typ_p``, ...)."""
    from ggflow.plugins.manager import get_plugin_manager

    key = entry.lower().replace("-", "_")
    name = _STAGE_ALIASES.get(key, key)
    return name if name in get_plugin_manager().samplers else entry  # a miss: the error names ``entry``


__all__ = ["SamplingParams", "build_chain", "sampler_from_params", "DEFAULT_SAMPLER_ORDER"]
