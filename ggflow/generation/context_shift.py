"""llama.cpp's context shift: a sequence that fills its context keeps its first ``n_keep`` tokens (and the
BOS), drops half of the rest, and moves the tail back (``seq_add``: the next decode re-rotates the cached keys
to their new positions). Off by default, as in llama-server (``--context-shift``)."""
from __future__ import annotations

from typing import Any

from ggflow.errors import ContextFullError, GGFlowError


def shift_sequence(memory: Any, seq_id: int, tokens: list[int], n_keep: int, bos_id: int | None) -> int:
    """Shift ``seq_id`` whose cells hold ``tokens`` (edited in place); return how many tokens stay untouched
    at the front (what a later prompt may still reuse). Raises ContextFullError when nothing can go."""
    n_past = len(tokens)
    kept = n_past if n_keep < 0 else min(n_keep, n_past)
    if tokens and tokens[0] == bos_id and n_keep >= 0:
        kept = min(kept + 1, n_past)  # always keep the BOS, as llama.cpp's main does
    n_discard = (n_past - kept) // 2
    if n_discard == 0:
        raise ContextFullError(f"the context is full and n_keep={n_keep} leaves nothing to discard")
    memory.seq_rm(seq_id, kept, kept + n_discard)
    try:
        memory.seq_add(seq_id, kept + n_discard, n_past, -n_discard)
    except GGFlowError as e:   # a window-sized cache that cannot shift: the sequence is not whole now
        memory.seq_rm(seq_id, 0, -1)
        tokens.clear()
        raise ContextFullError(f"the context is full and cannot be shifted: {e}") from None
    del tokens[kept: kept + n_discard]
    return kept
