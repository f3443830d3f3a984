"""A slot: one sequence id of the shared KV cache, and the request it is serving.

A slot is idle, evaluating its request's prompt (possibly over several steps, a chunk at a time), or
generating (one token per step). ``cache_tokens`` is always exactly what the KV cache holds for the slot's
sequence, so an idle slot's cache can be reused by the next request that shares its prefix.
"""
from __future__ import annotations

import enum
import time
from typing import Any

import numpy as np

from ggflow.api import FINISH_LENGTH, FINISH_STOP, Completion, StopMatcher, Timings
from ggflow.core.sampling import build_chain
from ggflow.serving.greedy_rows import argmax_plan
from ggflow.serving.request import Done, Piece, Request

FINISH_CANCELLED = "cancelled"   # the client went away; nobody reads the result
FINISH_ERROR = "error"           # the engine failed while serving the request (Done.error says how)


class SlotState(enum.Enum):
    IDLE = "idle"
    PROMPT = "prompt"          # prompt tokens still to evaluate
    GENERATING = "generating"  # ``pending`` is the sampled token to evaluate next


class Slot:
    def __init__(self, slot_id: int, seq_id: int, n_ctx: int):
        self.id, self.seq_id, self.n_ctx = slot_id, seq_id, n_ctx
        self.state = SlotState.IDLE
        self.cache_tokens: list[int] = []
        self.t_last_used = 0.0
        self.request: Request | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def assign(self, request: Request, reuse: int, vocab: Any) -> None:
        """Take a request whose first ``reuse`` prompt tokens are already cached (the rest was removed)."""
        self.request, self.state = request, SlotState.PROMPT
        self.cache_tokens = self.cache_tokens[:reuse]
        self.n_reused = reuse
        self.chain = (request.chain if request.chain is not None
                      else build_chain(request.sampling, vocab_size=vocab.n_vocab, vocab=vocab))
        for tok in request.prompt:  # repetition penalties look at the prompt too
            self.chain.accept(tok)
        if request.constraint is not None:   # after the prompt: prompt tokens are not grammar tokens
            self.chain.samplers.insert(0, request.constraint)
        self.argmax_plan = argmax_plan(self.chain)   # not None: the engine may pick the token by argmax
        self.vocab = vocab
        self.decoder = vocab.stream_decoder()
        self.stops = StopMatcher(request.stop)
        self.out: list[int] = []
        self.pending: int | None = None
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.timings = Timings(prompt_n=len(request.prompt) - reuse, cached_n=reuse)

    @property
    def is_busy(self) -> bool:
        return self.state is not SlotState.IDLE

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
        self.cache_tokens.extend(tokens)

    # -- sampling --------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray) -> bool:
        """Sample the next token and send its text; True when the request is finished."""
        self._first_token_time()
        return self._take(self.chain.sample(logits))

    def take_argmax(self, token: int) -> bool:
        """The token argmax_rows picked by this slot's ``argmax_plan`` (what its chain would sample)."""
        self._first_token_time()
        self.chain.accept(token)
        return self._take(token)

    def _first_token_time(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
            self.timings.prompt_ms = 1e3 * (self.t_first - self.t_start)

    def _take(self, token: int) -> bool:
        """Send the sampled token's text; True when the request is finished."""
        assert self.request is not None
        self.out.append(token)
        if self.vocab.is_eog(token):
            self.finish(FINISH_STOP)
            return True
        piece, hit = self.stops.push(self.decoder.feed(token))
        self._send(Piece(piece, token))
        if hit:
            self.finish(FINISH_STOP)
            return True
        if len(self.out) >= self.request.max_tokens or len(self.cache_tokens) >= self.n_ctx:
            self.finish(FINISH_LENGTH)  # the sampled token need not be evaluated: nobody reads its logits
            return True
        self.pending, self.state = token, SlotState.GENERATING
        return False

    def _send(self, event: Piece | Done) -> None:
        assert self.request is not None
        try:
            self.request.on_event(event)
        except Exception:  # the receiver is gone (e.g. its event loop closed): treat it as a disconnect
            self.request.cancel()

    def finish(self, reason: str, error: str | None = None) -> Completion:
        """Release the held text, send the result and go idle (the KV cache of the sequence stays)."""
        assert self.request is not None
        if reason != FINISH_CANCELLED and not self.stops.hit:
            tail, _ = self.stops.push(self.decoder.flush(), final=True)
            if tail:
                self._send(Piece(tail, -1))
        now = time.perf_counter()
        self.timings.predicted_n = len(self.out)
        self.timings.predicted_ms = 1e3 * (now - self.t_first) if self.t_first is not None else 0.0
        if self.t_first is None:
            self.timings.prompt_ms = 1e3 * (now - self.t_start)
        completion = Completion(self.stops.text, self.out, list(self.request.prompt), reason, self.timings)
        if reason != FINISH_CANCELLED:
            self._send(Done(completion, error))
        self.request, self.state, self.pending, self.t_last_used = None, SlotState.IDLE, None, now
        return completion

    # -- reporting -------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """As llama-server's /slots reports a slot (the fields ggflow has)."""
        r = self.request
        return {
            "id": self.id, "id_task": r.id if r is not None else -1, "n_ctx": self.n_ctx,
            "is_processing": self.is_busy, "state": self.state.value, "n_cached": len(self.cache_tokens),
            "n_prompt_tokens": len(r.prompt) if r is not None else 0,
            "next_token": {"has_next_token": self.state is SlotState.GENERATING,
                           "n_decoded": len(self.out) if r is not None else 0,
                           "n_remain": (r.max_tokens - len(self.out)) if r is not None else -1},
        }
