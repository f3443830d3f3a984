"""Mixture-of-experts hyperparameters: how many experts a layer has, how many each token uses, how the router's
logits become weights. Read from the keys llama.cpp reads (``{arch}.expert_*``) and checked as it checks them.

An architecture with experts reads them in its ``load_hparams`` (``load_experts``), keeps them in
``HParams.extra["experts"]`` and passes them to ``GraphBuilder.moe_ffn``; its weight record sizes the expert
tensors from them (``n_expert(hp)``, ``n_ff_exp(hp)``), so a tensor of another shape is refused at load.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

from ggflow.errors import ModelLoadError

if TYPE_CHECKING:
    from ggflow.core.metadata import Metadata
    from ggflow.core.hparams import HParams

MAX_EXPERTS = 1024    # LLAMA_MAX_EXPERTS


class Gating(IntEnum):
    """What turns the router's logits into expert weights (llama_expert_gating_func_type's numbers)."""
    SOFTMAX = 1          # softmax over all experts, then the top-k's probabilities
    SIGMOID = 2          # each expert's sigmoid
    SOFTMAX_WEIGHT = 3   # the top-k by raw logit, then softmax over those k


@dataclass(frozen=True)
class Experts:
    n_expert: int            # experts per layer (0: a dense model)
    n_expert_used: int       # experts each token is routed to (top-k)
    n_ff_exp: int            # an expert's hidden width
    gating: Gating
    norm_weights: bool       # divide the top-k weights by their sum
    weights_scale: float     # multiply them by this (0 or 1: unscaled, as llama.cpp)


def load_experts(meta: "Metadata", n_ff: int, *, required: bool, gating: Gating = Gating.SOFTMAX,
                 norm_weights: bool = False, from_file: bool = False,
                 n_ff_exp_key: str | None = "expert_feed_forward_length") -> Experts:
    """The expert keys of meta, checked.

    required: the architecture has no dense FFN (qwen3moe), so a file without experts is refused; otherwise
    none means a dense model (llama). gating, norm_weights: the architecture's routing. With from_file the
    file's ``expert_gating_func`` / ``expert_weights_norm`` choose instead where present; without, the
    architecture's are fixed (as llama.cpp hard-codes them for qwen3moe and llama) and a file that names
    others is refused rather than run differently from what it says. n_ff_exp_key: where an expert's width
    is (None: n_ff, as llama's experts use feed_forward_length).
    """
    key = meta.arch_key
    n_expert = meta.get_int(key("expert_count"), 0, min=0, max=MAX_EXPERTS)
    n_used = meta.get_int(key("expert_used_count"), 0, min=0, max=MAX_EXPERTS)
    if n_expert == 0:
        if required:
            raise ModelLoadError(f"{meta.path}: {key('expert_count')} is missing or 0, but {meta.arch} "
                                 f"needs experts (n_expert must be > 0)")
        if n_used:
            raise ModelLoadError(f"{meta.path}: {key('expert_used_count')} = {n_used} but "
                                 f"{key('expert_count')} = 0 (a dense model uses no experts)")
        return Experts(0, 0, 0, gating, norm_weights, 0.0)
    if not 0 < n_used <= n_expert:
        raise ModelLoadError(f"{meta.path}: {key('expert_used_count')} = {n_used} must be in 1..{n_expert} "
                             f"({key('expert_count')} = {n_expert})")
    file_gating = meta.get_int(key("expert_gating_func"), None, min=0)
    if file_gating is not None:
        if file_gating not in {int(g) for g in Gating}:
            known = ", ".join(f"{int(g)} ({g.name.lower()})" for g in Gating)
            raise ModelLoadError(f"{meta.path}: {key('expert_gating_func')} = {file_gating} is not a gating "
                                 f"function ggflow knows: {known}")
        if not from_file and file_gating != gating:
            raise ModelLoadError(f"{meta.path}: {key('expert_gating_func')} = {file_gating} "
                                 f"({Gating(file_gating).name.lower()}) but {meta.arch} routes with "
                                 f"{int(gating)} ({gating.name.lower()})")
        gating = Gating(file_gating)
    file_norm = meta.get_bool(key("expert_weights_norm"), None)
    if file_norm is not None:
        if not from_file and file_norm != norm_weights:
            raise ModelLoadError(f"{meta.path}: {key('expert_weights_norm')} = {file_norm} but {meta.arch} "
                                 f"{'normalises' if norm_weights else 'does not normalise'} the experts' weights")
        norm_weights = file_norm
    if n_ff_exp_key is None:
        n_ff_exp = n_ff
    else:                                          # absent or 0: n_ff / n_used, llama.cpp's default for qwen3moe
        n_ff_exp = meta.get_int(key(n_ff_exp_key), 0, min=0, max=2**31 - 1) or n_ff // n_used
    if n_ff_exp < 1:
        raise ModelLoadError(f"{meta.path}: the experts' feed-forward width is 0 ({key(n_ff_exp_key or '')})")
    return Experts(n_expert, n_used, n_ff_exp, gating, norm_weights,
                   meta.get_float(key("expert_weights_scale"), 0.0))


def experts_of(hp: "HParams") -> Experts:
    return hp.extra["experts"]


def n_expert(hp: "HParams") -> int:
    return experts_of(hp).n_expert


def n_ff_exp(hp: "HParams") -> int:
    return experts_of(hp).n_ff_exp


def has_experts(hp: "HParams") -> bool:
    """Whether the model's FFNs are experts (an architecture that may have either, as llama)."""
    experts = hp.extra.get("experts")
    return experts is not None and experts.n_expert > 0


def is_dense(hp: "HParams") -> bool:
    return not has_experts(hp)
