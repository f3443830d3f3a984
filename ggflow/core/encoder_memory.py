"""EncoderMemory: the memory of a non-causal encoder (BERT and kin), which keeps nothing.

An encoder reads each sequence whole, in one ubatch, and attends from every token to every token of its
own sequence (llama.cpp's ``build_attn_inp_no_cache``): there are no cells to keep between calls, so this
memory has none. Its one input is the mask [n_tokens, n_tokens] that keeps the ubatch's sequences apart
(0 within a sequence, -inf across), and ``attend_within_ubatch`` is attention over the ubatch's own K and V.
A sequence split across two ubatches would see only half of itself: ``begin`` refuses it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ggflow.core import ops
from ggflow.core.batch import BatchError, UBatch
from ggflow.core.memory import KVInputs, Memory, MemoryBatch, Slot
from ggflow.core.tensor import Tensor
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.core.graph_builder import GraphBuilder
    from ggflow.core.scheduler import Scheduler

ENCODER_SEQ_MAX = 256   # sequences one batch may carry (ids [0, 256)): inputs packed into a ubatch


class EncoderMemory(Memory):
    """No cells: every ubatch attends only to itself, its sequences kept apart by the mask."""

    nbytes = 0
    n_seq_max = ENCODER_SEQ_MAX

    def __init__(self, n_ctx: int):
        self.size = n_ctx   # the most tokens one batch may carry (what n_free reports)

    # -- the batch transaction -------------------------------------------------------------------
    def begin(self, ubatches: Iterable[UBatch]) -> MemoryBatch:
        steps, seen = [], set()
        for ub in ubatches:
            seqs = set(np.unique(ub.seq_id).tolist())
            if seqs & seen:
                raise BatchError(f"sequence {min(seqs & seen)} is split across ubatches: an encoder reads each "
                                 f"sequence whole, so a batch's sequences must fit n_ubatch tokens together")
            seen |= seqs
            steps.append((ub, Slot(np.arange(ub.n_tokens, dtype=np.int32), ub.pos, np.zeros((0, 0), bool),
                                   ub.n_tokens)))
        return MemoryBatch(steps, lambda slot: None, lambda: None)

    def update(self, scheduler: "Scheduler") -> bool:
        return False

    # -- graph building ----------------------------------------------------------------------------
    def build_inputs(self, n_tokens: int, n_kv: int) -> KVInputs:
        return KVInputs(ops.new_input("I32", (n_tokens,), "inp_kv_idxs"),
                        ops.new_input("F32", (n_kv, n_tokens), "inp_kq_mask"))

    def input_data(self, inputs: KVInputs, ubatch: UBatch, slot: Slot) -> dict[Tensor, np.ndarray]:
        same = ubatch.seq_id[:, None] == ubatch.seq_id[None, :]                  # [n_tokens, n_tokens]
        mask = np.where(same, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
        return {inputs.kv_idxs: slot.cells, inputs.kq_mask: mask}

    def cpy_k(self, il: int, k_cur: Tensor, idxs: Tensor) -> Tensor:
        raise GGFlowError("an encoder keeps no keys: its attention is attend_within_ubatch")

    cpy_v = cpy_k

    def get_k(self, il: int, n_kv) -> Tensor:
        raise GGFlowError("an encoder keeps no keys: its attention is attend_within_ubatch")

    get_v = get_k

    # -- sequences: nothing is kept, so there is nothing to forget -------------------------------
    def clear(self) -> None:
        pass

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        pass

    def seq_keep(self, seq_id: int) -> None:
        pass

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        raise GGFlowError("an encoder keeps no positions to move")

    def seq_pos_min(self, seq_id: int) -> int:
        return -1

    def seq_pos_max(self, seq_id: int) -> int:
        return -1

    @property
    def n_used(self) -> int:
        return 0


def attend_within_ubatch(b: "GraphBuilder", q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(K^T Q / sqrt(head_dim) + mask) V over the ubatch's own tokens, heads side by side.

    q, k, v [head_dim, n_head, n_tokens] -> [head_dim * n_head, n_tokens]; the mask (0 within a sequence,
    -inf across) is the memory's, so tokens of one sequence never see another's."""
    hp = b.hp
    q = ops.permute(q, 0, 2, 1, 3)                                              # [hd, n_tokens, n_head]
    k = ops.permute(k, 0, 2, 1, 3)                                              # [hd, n_tokens, n_head_kv]
    kq = ops.mul_mat(k, q)                                                      # [n_kv, n_tokens, n_head]
    kq = ops.soft_max(kq, b.memory.kq_mask(0, b.inp_memory), 1.0 / math.sqrt(hp.n_embd_head_k))
    v = ops.cont(ops.permute(v, 1, 2, 0, 3))                                    # [n_kv, hd, n_head_kv]
    kqv = ops.mul_mat(v, kq)                                                    # [hd, n_tokens, n_head]
    out = ops.cont(ops.permute(kqv, 0, 2, 1, 3))                                # [hd, n_head, n_tokens]
    return ops.reshape(out, hp.n_embd_head_v * hp.n_head, b.n_tokens)
