"""Sampling's public names in one place (docs/sampling.md): the chain (core/sampler_chain.py: TokenDataArray, the
Sampler protocol, SamplerChain, make_sampler) and the policy above it (core/sampling_params.py: SamplingParams,
the default order, build_chain). Plugins and callers import from here; neither module imports this one.
"""
from __future__ import annotations

from ggflow.core.sampler_chain import (LogitsProcessorSampler, Sampler, SamplerBase, SamplerChain, TokenDataArray,
                                       make_sampler)
from ggflow.core.sampling_params import DEFAULT_SAMPLER_ORDER, SamplingParams, build_chain
from ggflow.plugins.removed import removed_names

__all__ = ["TokenDataArray", "Sampler", "SamplerBase", "SamplerChain", "make_sampler", "LogitsProcessorSampler",
           "SamplingParams", "build_chain", "DEFAULT_SAMPLER_ORDER"]

__getattr__ = removed_names(__name__)   # a removed name says what replaced it
