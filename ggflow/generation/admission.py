"""Which idle slot a new request goes to: the one whose cached tokens share the longest prefix with it.

As llama-server's slot selection: reusing a cached prefix skips evaluating it. With no shared prefix, the
slot used least recently is taken, so recently used caches stay around longest for the next request.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ggflow.generation.slot import Slot


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def choose_slot(idle: Sequence[Slot], prompt: Sequence[int]) -> tuple[Slot, int]:
    """The idle slot for a prompt and the length of the prefix its cache shares with the prompt."""
    if not idle:
        raise ValueError("no idle slot")
    shared = [common_prefix_length(s.reusable_tokens(), prompt) for s in idle]
    best = int(np.argmax(shared))
    if shared[best] > 0:
        return idle[best], shared[best]
    return min(idle, key=lambda s: s.t_last_used), 0
