"""Slots and LoRA adapter mixes: a request's mix becomes its sequence's, and a cached prefix is reused only
from a slot whose cells were computed with the same mix (llama-server clears a slot's cache when its
adapters change, for the same reason: cached keys and values depend on the adapters). ``mix_for``,
``holds_mix`` and ``take_mix`` are the pieces for any placement policy that reuses or shares cached cells.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggflow.errors import ArgumentError
from ggflow.generation.admission import choose_slot
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


def choose_slot_for(ctx: Any, idle: Sequence[Slot], request: Request) -> tuple[Slot, int]:
    """choose_slot over the idle slots whose cache has the request's mix; else the least recently used slot,
    with nothing shared. The chosen slot's sequence takes the request's mix."""
    mix = mix_for(ctx, request)
    if mix is None:
        return choose_slot(idle, request.prompt)
    same = [s for s in idle if holds_mix(ctx, s, mix)]
    slot, shared = choose_slot(same, request.prompt) if same else (None, 0)
    if not shared:
        slot, shared = choose_slot(idle, ())
    take_mix(ctx, slot, mix)
    return slot, shared


def share_mix(ctx: Any, leader: Slot, fork: Slot) -> None:
    """n > 1: a sibling choice continues from the leader's cells, with its mix."""
    if getattr(ctx, "lora", None) is not None:
        take_mix(ctx, fork, ctx.lora.seq_scales[leader.seq_id])
