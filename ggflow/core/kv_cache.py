"""The unified KV cache: per layer, K and V rows for ``size`` cells shared by every sequence (in tensors of
whole CELL_PAGE pages: ``cells``).

Each cell records the position it holds (-1: free) and the set of sequences that see it. ``begin``
places a batch's ubatches in free cells, in order: each sequence's tokens go after the last cell it
already holds, so a sequence's cells stay in position order wherever other sequences sit between
them; and in pages of CELL_PAGE cells, each sequence its own where there is room (the rest of its last
page, then whole free pages), so that a backend can skip the pages a token does not see. The attention
sums over cells in cell order and a masked cell adds an exact zero, so that keeps a sequence's result
the same bits whether it ran alone or among others (after prefix reuse too). The
graph attends over the first ``n_kv`` cells (padded, so the graph's shape changes rarely) and the mask
says which of them each token sees.
With a ``SlidingWindow``, the local layers read a second mask that also hides the cells beyond the window
(every layer keeps every cell; kv_cache_iswa.py gives the local layers a window-sized cache instead).
A cache may hold some of the model's layers only (``layers``): the iswa memory is two such caches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from ggflow.core import ops
from ggflow.core.backend import Backend
from ggflow.core.batch import UBatch, sequences_of
from ggflow.core.memory import (CELL_PAGE, MAX_SEQ, N_KV_PAD, KVInputs, Memory, MemoryBatch, SlidingWindow, Slot,
                                page_cells)
from ggflow.core.hparams import HParams
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.core.scheduler import Scheduler


@dataclass(frozen=True)
class Cells:
    """A copy of the cell state: what a batch that did not land must leave unchanged."""
    pos: np.ndarray        # int32 [size]: position each cell holds, -1 if free
    seq: np.ndarray        # bool [size, n_seq_max]: the sequences that see each cell

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cells) and np.array_equal(self.pos, other.pos) \
            and np.array_equal(self.seq, other.seq)


class KVCache(Memory):
    def __init__(self, hp: HParams, size: int, backend: Backend, type_k: str = "F16", type_v: str = "F16",
                 n_seq_max: int = MAX_SEQ, swa: SlidingWindow | None = None,
                 layer_rope: Sequence[tuple[float, float]] | None = None, layers: Iterable[int] | None = None):
        """swa: the sliding-window layers, which read a windowed mask. layer_rope: each layer's RoPE
        (freq_base, freq_scale) where layers differ (the K-shift must re-rotate as the graph rotated).
        layers: the layers this cache holds K/V for (default: every layer); k and v list theirs, in order."""
        if size <= 0:
            raise GGFlowError(f"KV cache size must be positive, got {size}")
        if layer_rope is not None and len(layer_rope) != hp.n_layer:
            raise GGFlowError(f"layer_rope has {len(layer_rope)} entries for {hp.n_layer} layers")
        self.layers = tuple(range(hp.n_layer)) if layers is None else tuple(sorted(set(layers)))
        if any(not 0 <= il < hp.n_layer for il in self.layers):
            raise GGFlowError(f"layers {list(self.layers)} are not all in [0, {hp.n_layer})")
        self.hp, self.size, self.backend, self.n_seq_max = hp, size, backend, n_seq_max
        self.swa = swa
        self.layer_rope = tuple(layer_rope) if layer_rope is not None else \
            ((hp.rope_freq_base, hp.rope_freq_scale),) * hp.n_layer
        self._index = {il: i for i, il in enumerate(self.layers)}
        # The tensors hold whole pages: the attended range (n_kv) then always ends on a page, where a backend
        # reads the cache page by page (the CPU backend's fused attention needs it). Cells size .. cells-1
        # are never written and the mask hides them, as the padded range's free cells.
        self.cells = page_cells(size)
        self.k = [Tensor(type_k, (hp.n_embd_k_gqa, self.cells), name=f"cache_k_l{il}", flags=TensorFlag.PARAM)
                  for il in self.layers]
        self.v = [Tensor(type_v, (hp.n_embd_v_gqa, self.cells), name=f"cache_v_l{il}", flags=TensorFlag.PARAM)
                  for il in self.layers]
        offsets, total = [], 0
        for t in self.k + self.v:
            offsets.append(total)
            total += -(-t.nbytes // backend.alignment) * backend.alignment
        self.buffer = backend.alloc_buffer(max(total, backend.alignment))   # no layers: still a buffer
        for t, offs in zip(self.k + self.v, offsets):
            t.buffer, t.offset = self.buffer, offs
        self.nbytes = total
        self.pos = np.full(size, -1, dtype=np.int32)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)
        self.shift = np.zeros(size, dtype=np.int32)   # pending RoPE shift of each cell's K (seq_add)
        self.clear()

    # -- the batch transaction -------------------------------------------------------------------
    def begin(self, ubatches: Iterable[UBatch]) -> MemoryBatch | None:
        placed = self.place(ubatches)
        return None if placed is None else MemoryBatch(placed[0], self.apply_slot, placed[1])

    def place(self, ubatches: Iterable[UBatch]) -> tuple[list[tuple[UBatch, Slot]], Callable[[], None]] | None:
        """``begin``'s work: each ubatch's slot, and the function that puts the cells back as they are now
        (a memory of several caches places the batch in each and makes one MemoryBatch of them)."""
        pos, seq = self.pos, self.seq
        steps = []
        for ub in ubatches:
            slot = self._find_slot(ub, pos, seq)
            if slot is None:
                return None
            steps.append((ub, slot))
            pos, seq = slot.pos, slot.seq
        saved = self.cells_snapshot()
        return steps, lambda: self._restore(saved)

    def _restore(self, saved: Cells) -> None:
        self.pos, self.seq = saved.pos, saved.seq

    def _free_cells(self, pos: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """bool [size]: the cells of (pos, seq) a ubatch may be written to."""
        return pos < 0

    def _find_slot(self, ubatch: UBatch, pos: np.ndarray, seq: np.ndarray) -> Slot | None:
        """Free cells of (pos, seq) for the ubatch, with the state after it is written."""
        free = self._free_cells(pos, seq)
        if np.count_nonzero(free) < ubatch.n_tokens:
            return None
        cells = np.empty(ubatch.n_tokens, dtype=np.int32)
        seqs = sequences_of(ubatch.seq_id)
        for s in seqs:   # one pass per sequence in the ubatch, not per token
            rows = np.flatnonzero(ubatch.seq_id == s) if len(seqs) > 1 else np.arange(ubatch.n_tokens)
            held = np.flatnonzero(seq[:, s])
            after = int(held[-1]) + 1 if len(held) else 0
            cells[rows] = _room(free, after, len(rows))
            free[cells[rows]] = False
        pos, seq = pos.copy(), seq.copy()
        self._evict(pos, seq, cells)
        pos[cells] = ubatch.pos
        seq[cells, ubatch.seq_id] = True
        used = np.flatnonzero(pos >= 0)
        n_kv = min(self.cells, -(-(int(used[-1]) + 1) // N_KV_PAD) * N_KV_PAD)
        return Slot(cells, pos, seq, n_kv)

    def _evict(self, pos: np.ndarray, seq: np.ndarray, cells: np.ndarray) -> None:
        """Forget, in (pos, seq), what the given cells held before a ubatch is written to them (here they
        are free: nothing)."""

    def apply_slot(self, slot: Slot) -> None:
        """Make a placed ubatch's cells the cache's (``MemoryBatch`` does, as it reaches the ubatch)."""
        self.pos, self.seq = slot.pos, slot.seq

    def cells_snapshot(self) -> Cells:
        """A copy of every cell's position and sequences (compare two with ==)."""
        return Cells(self.pos.copy(), self.seq.copy())

    def update(self, scheduler: "Scheduler") -> bool:
        if not self.shift.any():
            return False
        from ggflow.core.kv_shift import apply_k_shift
        apply_k_shift(self, scheduler)
        self.shift[:] = 0
        return True

    # -- graph building ----------------------------------------------------------------------------
    def build_inputs(self, n_tokens: int, n_kv: int) -> KVInputs:
        swa = ops.new_input("F32", (n_kv, n_tokens), "inp_kq_mask_swa") if self.swa else None
        return KVInputs(ops.new_input("I32", (n_tokens,), "inp_kv_idxs"),
                        ops.new_input("F32", (n_kv, n_tokens), "inp_kq_mask"), swa)

    def input_data(self, inputs: KVInputs, ubatch: UBatch, slot: Slot) -> dict[Tensor, np.ndarray]:
        data = {inputs.kv_idxs: slot.cells, inputs.kq_mask: self.mask(slot, ubatch)}
        if inputs.kq_mask_swa is not None:
            data[inputs.kq_mask_swa] = self.mask(slot, ubatch, self.swa.n_swa)
        return data

    def kq_mask(self, il: int, inputs: KVInputs) -> Tensor:
        if self.swa is not None and il in self.swa.layers:
            return inputs.kq_mask_swa
        return inputs.kq_mask

    def mask(self, slot: Slot, ubatch: UBatch, window: int = 0) -> np.ndarray:
        """float32 [n_tokens, n_kv]: 0 where a token may attend to a cell, -inf elsewhere (causal, per seq).

        window > 0: also -inf where the cell is window or more positions behind the token."""
        pos, seq = slot.pos[: slot.n_kv], slot.seq[: slot.n_kv]
        visible = seq[:, ubatch.seq_id].T & (pos[None, :] <= ubatch.pos[:, None]) & (pos[None, :] >= 0)
        if window > 0:
            visible &= ubatch.pos[:, None] - pos[None, :] < window
        mask = np.full((ubatch.n_tokens, slot.n_kv), -np.inf, np.float32)    # the last page's cells past size too
        mask[:, :visible.shape[1]][visible] = 0.0
        return mask

    def layer_k(self, il: int) -> Tensor:
        """Layer il's key cache [n_embd_k_gqa, cells]."""
        return self.k[self._layer(il)]

    def layer_v(self, il: int) -> Tensor:
        """Layer il's value cache [n_embd_v_gqa, cells]."""
        return self.v[self._layer(il)]

    def _layer(self, il: int) -> int:
        if il not in self._index:
            raise GGFlowError(f"this KV cache holds layers {list(self.layers)}, not layer {il}")
        return self._index[il]

    def cpy_k(self, il: int, k_cur: Tensor, idxs: Tensor) -> Tensor:
        return ops.set_rows(self.layer_k(il), ops.reshape(_contiguous(k_cur), self.hp.n_embd_k_gqa, idxs.ne[0]), idxs)

    def cpy_v(self, il: int, v_cur: Tensor, idxs: Tensor) -> Tensor:
        return ops.set_rows(self.layer_v(il), ops.reshape(_contiguous(v_cur), self.hp.n_embd_v_gqa, idxs.ne[0]), idxs)

    def get_k(self, il: int, n_kv: int) -> Tensor:
        return _heads(self.layer_k(il), self.hp.n_embd_head_k, self.hp.n_head_kv, n_kv)

    def get_v(self, il: int, n_kv: int) -> Tensor:
        return _heads(self.layer_v(il), self.hp.n_embd_head_v, self.hp.n_head_kv, n_kv)

    # -- sequences ---------------------------------------------------------------------------------
    def _range(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        in_seq = self.seq.any(axis=1) if seq_id < 0 else self.seq[:, self._check_seq(seq_id)]
        return in_seq & (self.pos >= max(p0, 0)) & (self.pos < p1)

    def _check_seq(self, seq_id: int) -> int:
        if not 0 <= seq_id < self.n_seq_max:
            raise GGFlowError(f"sequence id {seq_id} is out of range [0, {self.n_seq_max})")
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
        sel = self._range(seq_id, p0, p1)
        if seq_id < 0:
            self.seq[sel] = False
        else:
            self.seq[sel, seq_id] = False
        self._free_empty()
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """No copy: the cells are shared."""
        self.seq[self._range(src, p0, p1), self._check_seq(dst)] = True

    def seq_keep(self, seq_id: int) -> None:
        keep = self.seq[:, self._check_seq(seq_id)].copy()
        self.seq[:] = False
        self.seq[keep, seq_id] = True
        self._free_empty()

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """K is re-rotated by the next ``update`` (RoPE rotations compose)."""
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

    # -- state ---------------------------------------------------------------------------------------
    def save_seq(self, seq_id: int) -> "KVSeqState":
        cells = np.flatnonzero(self.seq[:, self._check_seq(seq_id)])
        return KVSeqState(self.size, cells, self.pos[cells].copy(), self.shift[cells].copy(),
                          [self._rows(t)[cells].copy() for t in self.k], [self._rows(t)[cells].copy() for t in self.v])

    def load_seq(self, seq_id: int, state: "KVSeqState") -> None:
        self._check_seq(seq_id)
        if not isinstance(state, KVSeqState) or state.size != self.size or len(state.k) != len(self.k) or (
                len(state.k) and state.k[0].shape[1:] != self._rows(self.k[0]).shape[1:]):
            raise GGFlowError(f"this state was not saved by a KV cache of {self.size} cells and {len(self.k)} "
                              f"layers of this model")
        if (self.pos[state.cells] >= 0).any():
            raise GGFlowError("the cells of the saved state are in use: remove the sequences first (seq_rm)")
        for tensor, rows in zip(self.k + self.v, state.k + state.v):
            data = self._rows(tensor)
            data[state.cells] = rows
            self.backend.set_tensor(tensor, data)
        self.pos[state.cells] = state.pos
        self.seq[state.cells, seq_id] = True
        self.shift[state.cells] = state.shift

    def _rows(self, tensor: Tensor) -> np.ndarray:
        return self.backend.get_tensor(tensor).reshape(self.cells, -1)


@dataclass
class KVSeqState:
    """One sequence's cells of a KVCache and their K/V rows (per held layer), as ``save_seq`` copied them."""
    size: int
    cells: np.ndarray
    pos: np.ndarray
    shift: np.ndarray
    k: list[np.ndarray]
    v: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.k + self.v) + self.cells.nbytes + self.pos.nbytes)


def _contiguous(t: Tensor) -> Tensor:
    return t if t.is_contiguous() else ops.cont(t)


def _heads(cache: Tensor, head_dim: int, n_head_kv: int, n_kv: int) -> Tensor:
    """The first n_kv cells of a layer's cache [head_dim * n_head_kv, size] as [head_dim, n_head_kv, n_kv]."""
    return ops.view(cache, (head_dim, n_head_kv, n_kv), (cache.nb[0], cache.type.row_bytes(head_dim), cache.nb[1]))


def _room(free: np.ndarray, after: int, n: int) -> np.ndarray:
    """n free cells for a sequence whose cells so far end before ``after``, in order of preference: the
    rest of its last page, whole free pages from there on, any free cells from there on, any free cells
    (then its cells are no longer in position order: its results may change in the last bits, not their
    correctness). The caller has checked that n cells are free."""
    end = after + n
    if after % CELL_PAGE and end <= min(len(free), after - after % CELL_PAGE + CELL_PAGE) and free[after:end].all():
        return np.arange(after, end)   # a decode step's usual case: what _search_room finds, in two numpy calls
    return _search_room(free, after, n)


def _search_room(free: np.ndarray, after: int, n: int) -> np.ndarray:
    """_room's search, through every preference in turn (a dozen numpy calls)."""
    free = free.copy()
    taken = []

    def take(candidates: np.ndarray) -> None:
        nonlocal n
        got = candidates[free[candidates]][:n]
        free[got] = False
        taken.append(got)
        n -= len(got)

    if after % CELL_PAGE:
        take(np.arange(after, min(len(free), after - after % CELL_PAGE + CELL_PAGE)))
    if n:
        whole = len(free) // CELL_PAGE
        first = -(-after // CELL_PAGE)
        pages = np.flatnonzero(free[first * CELL_PAGE: whole * CELL_PAGE].reshape(-1, CELL_PAGE).all(axis=1))
        pages = pages[: -(-n // CELL_PAGE)] + first
        take((pages[:, None] * CELL_PAGE + np.arange(CELL_PAGE)).reshape(-1))
    if n:
        take(np.flatnonzero(free[after:]) + after)
    if n:
        take(np.flatnonzero(free))
    return np.concatenate(taken) if len(taken) > 1 else taken[0]
