"""The iswa memory: a sliding-window model's KV cache, with a window-sized cache for its local layers.

As llama.cpp's llama_kv_cache_iswa: two unified caches, one batch transaction. The global layers keep
n_ctx cells (``base``); the local layers, which only see the last ``n_swa`` positions, keep
``n_swa * n_seq + n_ubatch`` cells padded to 256 (``swa``, a ``WindowCache``), so a window plus a ubatch
always fits. A ``WindowCache`` writes a ubatch into a cell that is free or held by one sequence at a
position that sequence's next token no longer sees (p <= pos_max + 1 - n_swa); the older positions of
that sequence go with it, so each sequence keeps a contiguous run of positions (llama.cpp's
apply_ubatch purge). ``swa_full`` gives the local layers n_ctx cells too (llama.cpp's --swa-full).

Every sequence verb goes to both caches. The local layers of a continuation need the ``n_swa - 1``
positions before it, which the window cache may have dropped: a ``seq_rm`` after which they are missing
returns False and changes nothing (the caller removes the whole sequence, as llama.cpp's server does);
a ``seq_add`` (the context shift) that would bring dropped positions back into a window is refused.

Logits: until the window cache first reuses a cell its cells are the full cache's, in the same order,
and the attention is the same bits as a ``KVCache`` with the same ``SlidingWindow``. After that a local
layer's cells sit in another order (and among fewer masked cells), so softmax and V sums add the same
terms in another order: equal to rounding, not bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ggflow.core import ops
from ggflow.core.backend import Backend
from ggflow.core.batch import UBatch
from ggflow.core.kv_cache import Cells, KVCache
from ggflow.core.memory import MAX_SEQ, KVInputs, Memory, MemoryBatch, SlidingWindow, Slot
from ggflow.core.hparams import HParams
from ggflow.core.tensor import Tensor
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.core.scheduler import Scheduler

SWA_PAD = 256   # llama.cpp pads the window cache to 256 cells (llama.cpp issue 17037)


def window_cache_size(n_ctx: int, n_swa: int, n_ubatch: int, n_seq: int = 1, swa_full: bool = False) -> int:
    """Cells of the local layers' cache: llama.cpp's GGML_PAD(min(n_ctx, n_swa * n_seq + n_ubatch), 256)."""
    if swa_full:
        return n_ctx
    return -(-min(n_ctx, n_swa * n_seq + n_ubatch) // SWA_PAD) * SWA_PAD


class WindowCache(KVCache):
    """A unified cache of local layers only, whose cells are reused once out of their sequence's window."""

    def __init__(self, hp: HParams, size: int, backend: Backend, type_k: str, type_v: str, swa: SlidingWindow,
                 n_seq_max: int = MAX_SEQ, layer_rope: Sequence[tuple[float, float]] | None = None):
        super().__init__(hp, size, backend, type_k, type_v, n_seq_max, swa, layer_rope, layers=swa.layers)
        self.n_swa = swa.n_swa
        self._written: list[np.ndarray] = []   # cells the open batch's applied ubatches wrote
        self._kept: tuple[np.ndarray, list[np.ndarray]] | None = None   # rows a rollback puts back

    def _free_cells(self, pos: np.ndarray, seq: np.ndarray) -> np.ndarray:
        owners = seq.sum(axis=1)
        pos_max = np.where(seq, pos[:, None], -1).max(axis=0)          # [n_seq_max]: each sequence's last
        owner = seq.argmax(axis=1)
        gone = (owners == 1) & (pos_max[owner] + 1 - pos >= self.n_swa)  # llama.cpp's is_masked_swa
        return (pos < 0) | gone

    def _evict(self, pos: np.ndarray, seq: np.ndarray, cells: np.ndarray) -> None:
        held = cells[pos[cells] >= 0]
        if not len(held):
            return
        owner, last = seq[held].argmax(axis=1), pos[held]
        seq[held] = False
        for s in np.unique(owner):   # and the sequence's positions before the last one overwritten
            seq[seq[:, s] & (pos <= last[owner == s].max()), s] = False
        pos[~seq.any(axis=1)] = -1

    def place(self, ubatches: Iterable[UBatch]):
        placed = super().place(ubatches)
        self._written = []
        self._kept = self._save_window_rows(placed[0]) if placed is not None else None
        return placed

    def _save_window_rows(self, steps: list[tuple[UBatch, Slot]]) -> tuple[np.ndarray, list[np.ndarray]] | None:
        """The rows of cells the batch overwrites while they are still in their sequence's window now: a
        later ubatch of a long batch may reuse them, and a rollback must give them back."""
        written = np.unique(np.concatenate([slot.cells for _, slot in steps]))
        seen = ~self._free_cells(self.pos, self.seq)[written] & (self.pos[written] >= 0)
        cells = written[seen]
        if not len(cells):
            return None
        return cells, [self._rows(t)[cells].copy() for t in self.k + self.v]

    def apply_slot(self, slot: Slot) -> None:
        super().apply_slot(slot)
        self.shift[slot.cells] = 0   # a fresh row: no pending RoPE shift
        self._written.append(slot.cells)

    def _restore(self, saved: Cells) -> None:
        """The cells as begin found them. Those the batch overwrote that were in a window get their rows
        back; the others (out of every window) stay forgotten, their rows gone."""
        pos, seq = saved.pos.copy(), saved.seq.copy()
        if self._written:
            written = np.unique(np.concatenate(self._written))
            if self._kept is not None:
                cells, rows = self._kept
                for tensor, kept in zip(self.k + self.v, rows):
                    data = self._rows(tensor)
                    data[cells] = kept
                    self.backend.set_tensor(tensor, data)
                written = np.setdiff1d(written, cells)
            self._evict(pos, seq, written)
        self.pos, self.seq = pos, seq
        self._free_empty()
        self._written, self._kept = [], None


@dataclass
class IswaSlot:
    """Where a ubatch goes in each of the two caches."""
    base: Slot
    swa: Slot

    @property
    def n_kv(self) -> tuple[int, int]:
        return self.base.n_kv, self.swa.n_kv


@dataclass
class IswaSeqState:
    base: object
    swa: object

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + self.swa.nbytes


class IswaCache(Memory):
    """n_ctx cells for the global layers (``base``), a window-sized cache for the local ones (``swa``)."""

    def __init__(self, hp: HParams, n_ctx: int, backend: Backend, type_k: str, type_v: str, swa: SlidingWindow,
                 n_ubatch: int, n_seq_max: int = MAX_SEQ, n_seq: int = 1, swa_full: bool = False,
                 layer_rope: Sequence[tuple[float, float]] | None = None):
        """n_ubatch: the most tokens a ubatch brings (the Context's); n_seq: sequences whose windows the
        window cache holds at once (llama.cpp sizes it by n_seq_max); swa_full: n_ctx cells for it too."""
        if not swa.layers:
            raise GGFlowError("an iswa cache needs at least one sliding-window layer (else use a KVCache)")
        if n_ubatch <= 0 or n_seq <= 0:
            raise GGFlowError(f"n_ubatch and n_seq must be positive, got {n_ubatch} and {n_seq}")
        self.window = swa
        self.base = KVCache(hp, n_ctx, backend, type_k, type_v, n_seq_max, layer_rope=layer_rope,
                            layers=set(range(hp.n_layer)) - swa.layers)
        size_swa = window_cache_size(n_ctx, swa.n_swa, n_ubatch, n_seq, swa_full)
        self.swa = WindowCache(hp, size_swa, backend, type_k, type_v, swa, n_seq_max, layer_rope)
        self.size, self.n_seq_max = n_ctx, n_seq_max
        self.nbytes = self.base.nbytes + self.swa.nbytes

    def _part(self, il: int) -> KVCache:
        return self.swa if il in self.window.layers else self.base

    # -- the batch transaction -------------------------------------------------------------------
    def begin(self, ubatches: Iterable[UBatch]) -> MemoryBatch | None:
        ubatches = list(ubatches)
        base = self.base.place(ubatches)
        swa = self.swa.place(ubatches) if base is not None else None
        if swa is None:
            return None
        steps = [(ub, IswaSlot(b, w)) for (ub, b), (_, w) in zip(base[0], swa[0])]

        def apply(slot: IswaSlot) -> None:
            self.base.apply_slot(slot.base)
            self.swa.apply_slot(slot.swa)

        def restore() -> None:
            base[1]()
            swa[1]()

        return MemoryBatch(steps, apply, restore)

    def update(self, scheduler: "Scheduler") -> bool:
        ran_base = self.base.update(scheduler)
        return self.swa.update(scheduler) or ran_base

    # -- graph building ----------------------------------------------------------------------------
    def build_inputs(self, n_tokens: int, n_kv: tuple[int, int]) -> KVInputs:
        n_kv_base, n_kv_swa = n_kv
        return KVInputs(ops.new_input("I32", (n_tokens,), "inp_kv_idxs"),
                        ops.new_input("F32", (n_kv_base, n_tokens), "inp_kq_mask"),
                        ops.new_input("F32", (n_kv_swa, n_tokens), "inp_kq_mask_swa"),
                        ops.new_input("I32", (n_tokens,), "inp_kv_idxs_swa"))

    def input_data(self, inputs: KVInputs, ubatch: UBatch, slot: IswaSlot) -> dict[Tensor, np.ndarray]:
        return {inputs.kv_idxs: slot.base.cells, inputs.kq_mask: self.base.mask(slot.base, ubatch),
                inputs.kv_idxs_swa: slot.swa.cells,
                inputs.kq_mask_swa: self.swa.mask(slot.swa, ubatch, self.window.n_swa)}

    def kv_idxs(self, il: int, inputs: KVInputs) -> Tensor:
        return inputs.kv_idxs_swa if il in self.window.layers else inputs.kv_idxs

    def kq_mask(self, il: int, inputs: KVInputs) -> Tensor:
        return inputs.kq_mask_swa if il in self.window.layers else inputs.kq_mask

    def cpy_k(self, il: int, k_cur: Tensor, idxs: Tensor) -> Tensor:
        return self._part(il).cpy_k(il, k_cur, idxs)

    def cpy_v(self, il: int, v_cur: Tensor, idxs: Tensor) -> Tensor:
        return self._part(il).cpy_v(il, v_cur, idxs)

    def get_k(self, il: int, n_kv: tuple[int, int]) -> Tensor:
        return self._part(il).get_k(il, n_kv[il in self.window.layers])

    def get_v(self, il: int, n_kv: tuple[int, int]) -> Tensor:
        return self._part(il).get_v(il, n_kv[il in self.window.layers])

    # -- sequences ---------------------------------------------------------------------------------
    def clear(self) -> None:
        self.base.clear()
        self.swa.clear()

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        saved = self._snapshot()
        self.base.seq_rm(seq_id, p0, p1)
        self.swa.seq_rm(seq_id, p0, p1)
        if self._windows_complete():
            return True
        self._put_back(saved)
        return False

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        self.base.seq_cp(src, dst, p0, p1)
        self.swa.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.base.seq_keep(seq_id)
        self.swa.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        saved = self._snapshot()
        self.base.seq_add(seq_id, p0, p1, delta)
        try:
            self.swa.seq_add(seq_id, p0, p1, delta)
        except GGFlowError:
            self._put_back(saved)
            raise
        if not self._windows_complete():
            self._put_back(saved)
            raise GGFlowError(f"cannot move positions [{p0}, {p1}) of sequence {seq_id} by {delta}: the sliding "
                              f"window would reach positions the window-sized cache no longer holds (a context "
                              f"shift needs the window cache as large as the context: swa_full)")

    def seq_pos_min(self, seq_id: int) -> int:
        """The lowest position every layer still holds (the window cache's, as llama.cpp's iswa)."""
        return self.swa.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.base.seq_pos_max(seq_id)

    def _windows_complete(self) -> bool:
        """Whether, for every sequence, the window cache holds each position the global cache holds within
        the window of the sequence's next token (what a full cache's windowed mask would let it see)."""
        base, swa = self.base, self.swa
        for s in np.flatnonzero(base.seq.any(axis=0)):
            held = base.pos[base.seq[:, s]]
            seen = held[held >= held.max() + 2 - self.window.n_swa]
            if not np.isin(seen, swa.pos[swa.seq[:, s]]).all():
                return False
        return True

    def _snapshot(self) -> list[tuple[Cells, np.ndarray]]:
        return [(part.cells_snapshot(), part.shift.copy()) for part in (self.base, self.swa)]

    def _put_back(self, saved: list[tuple[Cells, np.ndarray]]) -> None:
        for part, (cells, shift) in zip((self.base, self.swa), saved):
            part.pos, part.seq, part.shift = cells.pos, cells.seq, shift

    @property
    def n_used(self) -> int:
        return self.base.n_used

    # -- state ---------------------------------------------------------------------------------------
    def save_seq(self, seq_id: int) -> IswaSeqState:
        return IswaSeqState(self.base.save_seq(seq_id), self.swa.save_seq(seq_id))

    def load_seq(self, seq_id: int, state: IswaSeqState) -> None:
        if not isinstance(state, IswaSeqState):
            raise GGFlowError("this state was not saved by an iswa cache")
        try:
            self.base.load_seq(seq_id, state.base)
            self.swa.load_seq(seq_id, state.swa)
        except GGFlowError:
            self.base.seq_rm(seq_id)   # not half a state: neither cache keeps what it took
            self.swa.seq_rm(seq_id)
            raise

    def cells_snapshot(self) -> tuple[Cells, Cells]:
        """Both caches' cells (compare two with ==)."""
        return self.base.cells_snapshot(), self.swa.cells_snapshot()
