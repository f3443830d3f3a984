"""Slots and LoRA adapter mixes: a request's mix becomes its sequence's, and a cached prefix is reused only
from a slot whose cells were computed with the same mix (llama-server clears a slot's cache when its
adapters change, for the same reason: cached keys and values depend on the adapters). ``mix_for``,
``holds_mix`` and ``take_mix`` are what the engine's placement (prefix_cache.PrefixSharing) asks, so it reuses
or shares cached cells only among slots of the same mix.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggflow.errors import ArgumentError
from ggflow.generation.request import Request
from ggflow.generation.slot import Slot


def check_request(ctx: Any, request: Request) -> None:
    """Refuse a request naming an adapter the context does not have (ArgumentError: the caller's 400)."""
    if request.lora is None:
        return
    if getattr(ctx, "lora", None) is None:
        if request.lora:
            raise ArgumentError("lora", [{"id": i, "scale": s} for i, s in request.lora.items()],
                                "empty: this model runs without LoRA adapters (ggflow serve --lora FILE)")
        return
    ctx.lora.mix(request.lora)


def mix_for(ctx: Any, request: Request) -> "np.ndarray | None":
    """The request's adapter mix (its own, else the default one now); None when the context has no adapters."""
    lora = getattr(ctx, "lora", None)
    return None if lora is None else lora.mix(request.lora)


def holds_mix(ctx: Any, slot: Slot, mix: "np.ndarray | None") -> bool:
    """Whether the slot's cached cells were computed with this mix (and may be reused or shared for it)."""
    return mix is None or np.array_equal(ctx.lora.seq_scales[slot.seq_id], mix)


def take_mix(ctx: Any, slot: Slot, mix: "np.ndarray | None") -> None:
    """The slot's sequence computes with this mix from now on."""
    if mix is not None:
        ctx.lora.set_sequence(slot.seq_id, mix)


def share_mix(ctx: Any, leader: Slot, fork: Slot) -> None:
    """n > 1: a sibling choice continues from the leader's cells, with its mix."""
    if getattr(ctx, "lora", None) is not None:
        take_mix(ctx, fork, ctx.lora.seq_scales[leader.seq_id])
