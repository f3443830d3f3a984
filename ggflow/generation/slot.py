"""A slot: one sequence id of the shared KV cache, and the request it is serving.

A slot is idle, evaluating its request's prompt (possibly over several steps, a chunk at a time), waiting for
the prompt of the request it is a sibling choice of (n > 1), or generating (one token per step).
``cache_tokens`` is always exactly what the KV cache holds for the slot's sequence; its first ``n_reusable``
may be reused by the next request that shares that prefix (a context shift leaves only the kept head).
"""
from __future__ import annotations

import enum
import time
from typing import Any

import numpy as np

from ggflow.generation.records import FINISH_LENGTH, Completion
from ggflow.generation.request import Done, Piece, Request
from ggflow.generation.sequence import SequenceState

FINISH_CANCELLED = "cancelled"   # the client went away; nobody reads the result
FINISH_ERROR = "error"           # the engine failed while serving the request (Done.error says how)


class SlotState(enum.Enum):
    IDLE = "idle"
    PROMPT = "prompt"          # prompt tokens still to evaluate
    FORKED = "forked"          # a sibling choice: takes the prompt's cells from another slot once evaluated
    GENERATING = "generating"  # ``pending`` is the sampled token to evaluate next


class Slot:
    def __init__(self, slot_id: int, seq_id: int, n_ctx: int):
        self.id, self.seq_id, self.n_ctx = slot_id, seq_id, n_ctx
        self.state = SlotState.IDLE
        self.cache_tokens: list[int] = []
        self.n_reusable = 0
        self.t_last_used = 0.0
        self.request: Request | None = None
        self.seq: SequenceState | None = None
        self.pending: int | None = None
        self.forks: list[Slot] = []     # sibling choices waiting for this slot's prompt (n > 1)
        self.leader: Slot | None = None  # FORKED: the slot evaluating the prompt this one shares
        self.context_shift = False      # a full sequence is shifted by the engine instead of ending

    # -- lifecycle -------------------------------------------------------------------------------
    def assign(self, request: Request, reuse: int, vocab: Any, forked: bool = False) -> None:
        """Take a request whose first ``reuse`` prompt tokens are already cached (the rest was removed)."""
        self.request = request
        self.state = SlotState.FORKED if forked else SlotState.PROMPT
        self.cache_tokens = self.cache_tokens[:reuse]
        self.n_reusable = self.n_reused = reuse
        self.seq = SequenceState(request.prompt, vocab, request.chain, constraint=request.constraint,
                                 stops=request.stop, max_tokens=request.max_tokens, n_top=request.n_top,
                                 prompt_logprobs=request.prompt_logprobs, criteria=request.stopping_criteria,
                                 n_reused=reuse)
        self.pending = None

    def fork_from(self, source: "Slot") -> None:
        """A sibling's prompt is evaluated: this slot's sequence now shares its cells (Memory.seq_cp)."""
        self.cache_tokens, self.n_reusable = list(source.cache_tokens), len(source.cache_tokens)
        self.seq.timings.prompt_n, self.seq.timings.cached_n = 0, len(source.cache_tokens)
        if source.seq.prompt_logprobs is not None and self.seq.prompt_logprobs is not None:
            self.seq.prompt_logprobs[:] = source.seq.prompt_logprobs
        self.state = SlotState.PROMPT

    @property
    def is_busy(self) -> bool:
        return self.state is not SlotState.IDLE

    @property
    def timings(self):
        return self.seq.timings

    def reusable_tokens(self) -> list[int]:
        return self.cache_tokens[: self.n_reusable]

    def prompt_left(self) -> list[int]:
        assert self.request is not None
        return self.request.prompt[len(self.cache_tokens):]

    def tokens_to_evaluate(self, budget: int) -> list[int]:
        """This step's tokens: the pending token, or the next chunk of the prompt (at most ``budget``)."""
        if self.state is SlotState.GENERATING:
            return [self.pending] if budget >= 1 else []
        return self.prompt_left()[:budget]

    def evaluated(self, tokens: list[int]) -> None:
        """The tokens went into the KV cache."""
        if len(self.cache_tokens) == self.n_reusable:
            self.n_reusable += len(tokens)
        self.cache_tokens.extend(tokens)

    # -- sampling --------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray) -> bool:
        """Sample the next token and send its text; True when the request is finished."""
        return self._take(self.seq.sample(logits), logits)

    def take_argmax(self, token: int, logits: np.ndarray | None) -> bool:
        """The token argmax_rows picked by this slot's ``argmax_plan`` (what its chain would sample)."""
        return self._take(self.seq.accept_argmax(token), logits)

    def _take(self, token: int, logits: np.ndarray | None) -> bool:
        """Send the sampled token's text; True when the request is finished."""
        piece, reason = self.seq.take(token, logits)
        if reason is None or not self.seq.vocab.is_eog(token):   # an end-of-generation token has no text
            self._send(Piece(piece, token, self.seq.logprobs[-1] if self.seq.logprobs else None))
        if reason is not None:
            self.finish(reason)
            return True
        if len(self.cache_tokens) >= self.n_ctx and not self.context_shift:
            self.finish(FINISH_LENGTH, context_full=True)   # no cell left in this sequence for the token
            return True
        self.pending, self.state = token, SlotState.GENERATING
        return False

    def _send(self, event: Piece | Done) -> None:
        assert self.request is not None
        try:
            self.request.on_event(event)
        except Exception:  # the receiver is gone (e.g. its event loop closed): treat it as a disconnect
            self.request.cancel()

    def finish(self, reason: str, error: str | None = None, context_full: bool = False,
               exception: BaseException | None = None) -> Completion:
        """Release the held text, send the result and go idle (the KV cache of the sequence stays)."""
        assert self.request is not None
        tail, completion = self.seq.finish(reason, release=reason != FINISH_CANCELLED, context_full=context_full)
        if tail:
            self._send(Piece(tail, -1))
        if reason != FINISH_CANCELLED:
            self._send(Done(completion, error, exception))
        now = time.perf_counter()
        self.request, self.state, self.pending, self.t_last_used = None, SlotState.IDLE, None, now
        self.forks = []
        return completion

    # -- reporting -------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """As llama-server's /slots reports a slot (the fields ggflow has)."""
        r = self.request
        n_out = len(self.seq.out) if r is not None else 0
        return {
            "id": self.id, "id_task": r.id if r is not None else -1, "n_ctx": self.n_ctx,
            "is_processing": self.is_busy, "state": self.state.value, "n_cached": len(self.cache_tokens),
            "n_prompt_tokens": len(r.prompt) if r is not None else 0,
            "next_token": {"has_next_token": self.state is SlotState.GENERATING, "n_decoded": n_out,
                           "n_remain": (r.max_tokens - n_out) if r is not None and r.max_tokens else -1},
        }
