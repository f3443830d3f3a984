"""save_state / load_state: the tokens an LLM has cached and their K/V cells, copied out and back.

A continuation after load_state is the one the LLM would have made had it never moved on: the cells come
back with their positions, so the next prompt that extends the saved tokens reuses them, as it would have.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggflow.errors import ArgumentError, GGFlowError


@dataclass
class LLMState:
    """What llama-cpp-python's LlamaState holds for one sequence: its tokens and the K/V of their cells."""
    input_ids: np.ndarray          # the cached tokens, in position order
    n_ctx: int
    memory: object                 # the memory's copy of sequence 0 (Memory.save_seq): cells, positions, K/V
    reusable: int
    seed: int | None

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def llama_state_size(self) -> int:
        return int(self.memory.nbytes)


class StateMixin:
    def save_state(self) -> LLMState:
        self._require_context()
        with self._lock.turn():
            return self._copy_state()

    def _copy_state(self) -> LLMState:
        """save_state's work, for a caller holding the turn (the prompt cache, llama_cache.py)."""
        ctx = self.context
        return LLMState(np.asarray(self._cached, dtype=np.intc), ctx.n_ctx, ctx.memory.save_seq(0),
                        self._reusable, self.seed)

    def load_state(self, state: LLMState) -> None:
        ctx = self._require_context()
        if not isinstance(state, LLMState):
            raise ArgumentError("state", state, "an LLMState from save_state()")
        if state.n_ctx != ctx.n_ctx:
            raise ArgumentError("state", f"<LLMState n_ctx={state.n_ctx}>",
                                f"a state saved by an LLM of this model with n_ctx={ctx.n_ctx}")
        with self._lock.turn():
            self._restore_state(state)

    def _restore_state(self, state: LLMState) -> None:
        """load_state's work, for a caller holding the turn (the prompt cache, llama_cache.py)."""
        ctx = self.context
        ctx.memory.seq_rm(-1, 0, -1)
        try:
            ctx.memory.load_seq(0, state.memory)
        except GGFlowError as e:
            self._cached, self._reusable = [], 0   # the cache was emptied: nothing of it to reuse
            raise ArgumentError("state", f"<LLMState n_ctx={state.n_ctx}>",
                                f"a state saved by an LLM of this model with n_ctx={ctx.n_ctx} ({e})") from None
        self._cached, self._reusable = [int(t) for t in state.input_ids], state.reusable
        self.seed = state.seed
