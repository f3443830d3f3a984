"""Memory: the KV cache as an explicit, budgeted resource with a slot map.

The unified cache holds, per layer, K and V rows for ``size`` cells. Each cell records the position it
holds (-1: free) and the set of sequences that see it. A ubatch first asks for slots (``find_slot``);
no room is a ``None``, never an exception, and nothing changes until the ubatch has been computed and
its slot is committed. The graph attends over the first ``n_kv`` cells (padded, so the graph's shape
changes rarely); which of them a token may see is the mask, an input tensor, not graph structure.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ggflow.core.backend import Backend
from ggflow.core.batch import UBatch
from ggflow.core.model import HParams
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.errors import GGFlowError

N_KV_PAD = 256     # the attended range grows in these steps, as llama.cpp pads it
MAX_SEQ = 64       # distinct sequence ids one cache tracks


@dataclass
class Slot:
    """Where a ubatch's tokens go, and the cell state after they are written."""
    cells: np.ndarray      # int32 [n_tokens]: cell index of each token
    pos: np.ndarray        # int32 [size]: cell positions with the ubatch written
    seq: np.ndarray        # bool [size, MAX_SEQ]
    n_kv: int              # cells the graph attends over


class Memory(ABC):
    """What Context needs from a model's memory. The unified KV cache is the built-in one."""

    @abstractmethod
    def find_slot(self, ubatch: UBatch) -> Slot | None: ...
    @abstractmethod
    def commit(self, slot: Slot) -> None: ...
    @abstractmethod
    def clear(self) -> None: ...
    @abstractmethod
    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool: ...
    @abstractmethod
    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None: ...
    @abstractmethod
    def seq_keep(self, seq_id: int) -> None: ...
    @abstractmethod
    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None: ...
    @abstractmethod
    def seq_pos_max(self, seq_id: int) -> int: ...


class KVCache(Memory):
    def __init__(self, hp: HParams, size: int, backend: Backend, type_k: str = "F16", type_v: str = "F16"):
        if size <= 0:
            raise GGFlowError(f"KV cache size must be positive, got {size}")
        self.hp, self.size, self.backend = hp, size, backend
        self.k = [Tensor(type_k, (hp.n_embd_k_gqa, size), name=f"cache_k_l{il}", flags=TensorFlag.PARAM)
                  for il in range(hp.n_layer)]
        self.v = [Tensor(type_v, (hp.n_embd_v_gqa, size), name=f"cache_v_l{il}", flags=TensorFlag.PARAM)
                  for il in range(hp.n_layer)]
        offsets, total = [], 0
        for t in self.k + self.v:
            offsets.append(total)
            total += -(-t.nbytes // backend.alignment) * backend.alignment
        self.buffer = backend.alloc_buffer(total)
        for t, offs in zip(self.k + self.v, offsets):
            t.buffer, t.offset = self.buffer, offs
        self.nbytes = total
        self.pos = np.full(size, -1, dtype=np.int32)
        self.seq = np.zeros((size, MAX_SEQ), dtype=bool)
        self.shift = np.zeros(size, dtype=np.int32)   # pending RoPE shift of each cell's K (seq_add)
        self.clear()

    # -- slots ---------------------------------------------------------------------------------
    def find_slot(self, ubatch: UBatch) -> Slot | None:
        free = np.flatnonzero(self.pos < 0)
        if len(free) < ubatch.n_tokens:
            return None
        cells = free[: ubatch.n_tokens].astype(np.int32)
        pos, seq = self.pos.copy(), self.seq.copy()
        pos[cells] = ubatch.pos
        seq[cells, ubatch.seq_id] = True
        used = np.flatnonzero(pos >= 0)
        n_kv = min(self.size, -(-(int(used[-1]) + 1) // N_KV_PAD) * N_KV_PAD)
        return Slot(cells, pos, seq, n_kv)

    def commit(self, slot: Slot) -> None:
        self.pos, self.seq = slot.pos, slot.seq

    def mask(self, slot: Slot, ubatch: UBatch) -> np.ndarray:
        """float32 [n_tokens, n_kv]: 0 where a token may attend to a cell, -inf elsewhere (causal, per seq)."""
        pos, seq = slot.pos[: slot.n_kv], slot.seq[: slot.n_kv]
        visible = seq[:, ubatch.seq_id].T & (pos[None, :] <= ubatch.pos[:, None]) & (pos[None, :] >= 0)
        return np.where(visible, np.float32(0), np.float32(-np.inf))

    # -- sequences -------------------------------------------------------------------------------
    def _range(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        in_seq = self.seq.any(axis=1) if seq_id < 0 else self.seq[:, self._check_seq(seq_id)]
        return in_seq & (self.pos >= max(p0, 0)) & (self.pos < p1)

    @staticmethod
    def _check_seq(seq_id: int) -> int:
        if not 0 <= seq_id < MAX_SEQ:
            raise GGFlowError(f"sequence id {seq_id} is out of range [0, {MAX_SEQ})")
        return seq_id

    def _free_empty(self) -> None:
        empty = ~self.seq.any(axis=1)
        self.pos[empty] = -1
        self.shift[empty] = 0

    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = False
        self.shift[:] = 0
        for t in self.k + self.v:  # free cells are masked, but 0 * NaN would still poison V sums
            self.backend.set_tensor(t, np.zeros(t.nrows * t.row_bytes, dtype=np.uint8)
                                    if t.type.is_quantized else np.zeros(t.ne[::-1], dtype=np.float32))

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        """Forget positions [p0, p1) of a sequence (seq_id < 0: of every sequence)."""
        sel = self._range(seq_id, p0, p1)
        if seq_id < 0:
            self.seq[sel] = False
        else:
            self.seq[sel, seq_id] = False
        self._free_empty()
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Let sequence dst see src's cells in [p0, p1) (no copy: cells are shared)."""
        self.seq[self._range(src, p0, p1), self._check_seq(dst)] = True

    def seq_keep(self, seq_id: int) -> None:
        keep = self.seq[:, self._check_seq(seq_id)].copy()
        self.seq[:] = False
        self.seq[keep, seq_id] = True
        self._free_empty()

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions [p0, p1) of a sequence by delta; K is re-rotated before the next decode."""
        if self.hp.n_rot == 0:
            raise GGFlowError("this model has no RoPE: its cached keys cannot be shifted to new positions")
        sel = self._range(seq_id, p0, p1)
        if delta == 0 or not sel.any():
            return
        if self.seq[sel].sum(axis=1).max() > 1:
            raise GGFlowError("cannot shift cells shared with another sequence (seq_cp); remove the share first")
        self.pos[sel] += delta
        self.shift[sel] += delta
        gone = sel & (self.pos < 0)
        self.seq[gone] = False
        self._free_empty()

    def seq_pos_max(self, seq_id: int) -> int:
        cells = self.seq[:, self._check_seq(seq_id)]
        return int(self.pos[cells].max()) if cells.any() else -1

    def seq_pos_min(self, seq_id: int) -> int:
        cells = self.seq[:, self._check_seq(seq_id)]
        return int(self.pos[cells].min()) if cells.any() else -1

    @property
    def n_used(self) -> int:
        return int((self.pos >= 0).sum())

    @property
    def has_shift(self) -> bool:
        return bool(self.shift.any())
