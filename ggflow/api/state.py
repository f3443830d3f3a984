"""save_state / load_state: the tokens an LLM has cached and their K/V cells, copied out and back.

A continuation after load_state is the one the LLM would have made had it never moved on: the cells come
back with their positions, so the next prompt that extends the saved tokens reuses them, as it would have.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggflow.errors import ArgumentError


@dataclass
class LLMState:
    """What llama-cpp-python's LlamaState holds for one sequence: its tokens and the K/V of their cells."""
    input_ids: np.ndarray          # the cached tokens, in position order
    n_ctx: int
    cells: np.ndarray              # which cache cells held them
    pos: np.ndarray                # the position each cell holds
    shift: np.ndarray              # pending RoPE shift of each cell
    k: list[np.ndarray]            # per layer: the cells' K rows
    v: list[np.ndarray]
    reusable: int
    seed: int | None

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def llama_state_size(self) -> int:
        return int(sum(a.nbytes for a in self.k + self.v) + self.cells.nbytes + self.pos.nbytes)


def _rows(memory, tensor) -> np.ndarray:
    return memory.backend.get_tensor(tensor).reshape(memory.size, -1)


class StateMixin:
    def save_state(self) -> LLMState:
        ctx = self._require_context()
        with self._lock.turn():
            memory = ctx.memory
            cells = np.flatnonzero(memory.seq[:, 0])
            return LLMState(np.asarray(self._cached, dtype=np.intc), ctx.n_ctx, cells, memory.pos[cells].copy(),
                            memory.shift[cells].copy(), [_rows(memory, t)[cells].copy() for t in memory.k],
                            [_rows(memory, t)[cells].copy() for t in memory.v], self._reusable, self.seed)

    def load_state(self, state: LLMState) -> None:
        ctx = self._require_context()
        if not isinstance(state, LLMState):
            raise ArgumentError("state", state, "an LLMState from save_state()")
        memory = ctx.memory
        if state.n_ctx != ctx.n_ctx or len(state.k) != len(memory.k) or (
                len(state.k) and state.k[0].shape[1:] != _rows(memory, memory.k[0]).shape[1:]):
            raise ArgumentError("state", f"<LLMState n_ctx={state.n_ctx}, {len(state.k)} layers>",
                                f"a state saved by an LLM of this model with n_ctx={ctx.n_ctx}")
        with self._lock.turn():
            memory.seq_rm(-1, 0, -1)
            for tensor, rows in zip(memory.k + memory.v, state.k + state.v):
                data = _rows(memory, tensor)
                data[state.cells] = rows
                memory.backend.set_tensor(tensor, data)
            memory.pos[state.cells] = state.pos
            memory.seq[state.cells, 0] = True
            memory.shift[state.cells] = state.shift
            self._cached, self._reusable = [int(t) for t in state.input_ids], state.reusable
            self.seed = state.seed
