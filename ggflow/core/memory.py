"""Memory: what a Context needs from a model's memory (the KV cache), and the batch transaction over it.

A memory owns its layout and its state. The graph asks it for writes (``cpy_k``/``cpy_v``: set_rows into
the cells of the ubatch being evaluated) and reads (``get_k``/``get_v``: views over the first ``n_kv``
cells); which of those cells a token may see is the mask, an input tensor the memory fills. A batch is a
transaction: ``begin`` places every ubatch (no room: ``None``, nothing changed), iterating it applies
each ubatch's cells, and unless ``commit`` is called every cell goes back as ``begin`` found it.

The unified cache (kv_cache.py) is the built-in memory; kv_cache_iswa.py composes two of them for
sliding-window models (n_ctx cells for the global layers, a window-sized cache for the local ones, as
llama.cpp's iswa cache). An architecture brings its memory from ``Architecture.create_memory``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from ggflow.core.batch import UBatch
from ggflow.core.tensor import Tensor
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.core.scheduler import Scheduler

N_KV_PAD = 256     # the attended range grows in these steps, as llama.cpp pads it
# A sequence's cells are kept in pages of this many cells where there is room (kv_cache.py), so that a
# page of a cache several sequences share holds one sequence's cells and a backend can skip the pages a
# token cannot see (the CPU's attention kernels do, per 64 cells).
CELL_PAGE = 64
MAX_SEQ = 64       # distinct sequence ids the unified cache tracks


def page_cells(size: int) -> int:
    """The cells a KV cache of ``size`` cells holds per layer: whole CELL_PAGE pages, so that the attended
    range ends on a page (kv_cache.py; the memory estimate counts the same)."""
    return -(-size // CELL_PAGE) * CELL_PAGE


@dataclass
class Slot:
    """Where a ubatch's tokens go, and the cell state after they are written."""
    cells: np.ndarray      # int32 [n_tokens]: cell index of each token
    pos: np.ndarray        # int32 [size]: cell positions with the ubatch written
    seq: np.ndarray        # bool [size, n_seq_max]
    n_kv: int | tuple[int, ...]   # cells the graph attends over (a memory of two caches: one count each);
                                  # the graph's shape, so a Context reuses a graph while it is equal


@dataclass
class KVInputs:
    """The graph inputs that belong to the memory, made once per graph by ``Memory.build_inputs``."""
    kv_idxs: Tensor        # I32 [n_tokens]: the cell each token's K/V row is written to
    kq_mask: Tensor        # F32 [n_kv, n_tokens]: 0 where a token may attend to a cell, -inf elsewhere
    kq_mask_swa: Tensor | None = None   # the same for sliding-window layers: also -inf beyond the window
    kv_idxs_swa: Tensor | None = None   # the cells of sliding-window layers, where they have a cache of their own


@dataclass(frozen=True)
class SlidingWindow:
    """Layers that attend only to the last ``n_swa`` positions (llama.cpp's LLAMA_SWA_TYPE_STANDARD).

    A token at position p sees a cell at position p0 of such a layer when p - p0 < n_swa."""
    n_swa: int
    layers: frozenset[int]   # the local (windowed) layers; the others attend over everything

    def __post_init__(self):
        if self.n_swa <= 0:
            raise GGFlowError(f"a sliding window needs n_swa > 0, got {self.n_swa}")

    @classmethod
    def every(cls, n_swa: int, n_layer: int, pattern: int) -> "SlidingWindow":
        """llama.cpp's set_swa_pattern: of each ``pattern`` layers, all but the last are local."""
        return cls(n_swa, frozenset(il for il in range(n_layer) if pattern == 0 or il % pattern < pattern - 1))


class MemoryBatch:
    """A batch placed in a memory: a transaction over its ubatches.

    Iterating yields ``(ubatch, slot)`` after applying that ubatch's cells to the memory (so a later
    ubatch's mask sees the earlier ones). ``commit()`` keeps them; leaving the ``with`` block without a
    commit (an exception, a failed ubatch, an early return) restores every cell as ``begin`` found it.
    The K/V rows a rolled-back ubatch wrote stay in cells that are free again, where the mask hides them.
    """

    def __init__(self, steps: list[tuple[UBatch, Slot]], apply: Callable[[Slot], None],
                 restore: Callable[[], None]):
        self._steps, self._apply, self._restore = steps, apply, restore
        self._n_applied = 0
        self._open = True

    def __enter__(self) -> "MemoryBatch":
        return self

    def __exit__(self, *exc_info) -> bool:
        self.rollback()
        return False

    def __len__(self) -> int:
        return len(self._steps)

    def __iter__(self) -> Iterator[tuple[UBatch, Slot]]:
        for ub, slot in self._steps:
            self._check_open()
            self._apply(slot)
            self._n_applied += 1
            yield ub, slot

    def commit(self) -> None:
        """Keep what the batch wrote; every ubatch must have been applied."""
        self._check_open()
        if self._n_applied != len(self._steps):
            raise GGFlowError(f"commit after {self._n_applied} of {len(self._steps)} ubatches: a batch "
                              f"lands whole or not at all")
        self._open = False

    def rollback(self) -> None:
        """Put every cell back as begin found it (nothing to do once committed)."""
        if self._open:
            self._restore()
            self._open = False

    def _check_open(self) -> None:
        if not self._open:
            raise GGFlowError("this memory batch was already committed or rolled back")


class Memory(ABC):
    """The contract a model's memory meets; the unified KV cache (kv_cache.KVCache) is the built-in one.

    State is cells: each holds a position (or is free) and the set of sequences that see it. Context
    calls, per decode: ``update(scheduler)`` (pending work such as the K-shift, on the Context's
    scheduler), then ``begin(ubatches)``, and per ubatch ``input_data`` for the graph built over
    ``build_inputs``; ``GraphBuilder.attention`` calls ``cpy_k``/``cpy_v``/``get_k``/``get_v`` and
    ``kq_mask`` (which of the memory's masks a layer reads). The sequence verbs (``seq_*``, ``clear``)
    are llama.cpp's ``llama_memory_*`` calls, for users and the serving engine.
    """

    size: int          # cells
    nbytes: int        # bytes of backend memory the cells' K/V occupy
    n_seq_max: int     # sequence ids are in [0, n_seq_max)

    # -- the batch transaction -------------------------------------------------------------------
    @abstractmethod
    def begin(self, ubatches: Iterable[UBatch]) -> MemoryBatch | None:
        """Place every ubatch of a batch; ``None`` when they do not all fit, with nothing changed.

        No state changes until the returned batch is iterated, and none survive without its commit."""

    @abstractmethod
    def update(self, scheduler: "Scheduler") -> bool:
        """Do pending work on the cache's data (the K-shift after ``seq_add``) on the given scheduler.

        True when a graph ran: it was allocated on the scheduler, so a caller's allocated graph is stale."""

    # -- graph building ----------------------------------------------------------------------------
    @abstractmethod
    def build_inputs(self, n_tokens: int, n_kv: int) -> KVInputs:
        """New input tensors for a graph over n_tokens tokens attending over n_kv cells."""

    @abstractmethod
    def input_data(self, inputs: KVInputs, ubatch: UBatch, slot: Slot) -> dict[Tensor, np.ndarray]:
        """The values of ``inputs`` for a ubatch placed at ``slot``."""

    def kv_idxs(self, il: int, inputs: KVInputs) -> Tensor:
        """The cell indices layer il's K/V rows are written to (a memory whose layers keep different
        caches gives each layer its own)."""
        return inputs.kv_idxs

    def kq_mask(self, il: int, inputs: KVInputs) -> Tensor:
        """The mask layer il's attention reads: the windowed one for a sliding-window layer, where the
        memory has one (``GraphBuilder.attention`` asks for it per layer)."""
        return inputs.kq_mask

    @abstractmethod
    def cpy_k(self, il: int, k_cur: Tensor, idxs: Tensor) -> Tensor:
        """The set_rows node writing k_cur [head_dim, n_head_kv, n_tokens] of layer il at cells idxs."""

    @abstractmethod
    def cpy_v(self, il: int, v_cur: Tensor, idxs: Tensor) -> Tensor:
        """The set_rows node writing v_cur [head_dim, n_head_kv, n_tokens] of layer il at cells idxs."""

    @abstractmethod
    def get_k(self, il: int, n_kv) -> Tensor:
        """A view of layer il's keys over the first n_kv cells: [head_dim_k, n_head_kv, n_kv] (n_kv: the
        slot's; a memory with a tuple there picks layer il's count)."""

    @abstractmethod
    def get_v(self, il: int, n_kv) -> Tensor:
        """A view of layer il's values over the first n_kv cells: [head_dim_v, n_head_kv, n_kv]."""

    # -- sequences ---------------------------------------------------------------------------------
    @abstractmethod
    def clear(self) -> None:
        """Forget every cell."""

    @abstractmethod
    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        """Forget positions [p0, p1) of a sequence (seq_id < 0: of every one; p1 < 0: to the end).

        False, with nothing changed, when the memory cannot forget part of a sequence and still continue
        it (a window-sized cache that no longer holds the window before p0): remove it all instead."""

    @abstractmethod
    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Let sequence dst see src's cells in [p0, p1)."""

    @abstractmethod
    def seq_keep(self, seq_id: int) -> None:
        """Forget every sequence but this one."""

    @abstractmethod
    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move positions [p0, p1) of a sequence by delta (the data follows at the next ``update``)."""

    @abstractmethod
    def seq_pos_min(self, seq_id: int) -> int:
        """The lowest position the sequence holds; -1 if none."""

    @abstractmethod
    def seq_pos_max(self, seq_id: int) -> int:
        """The highest position the sequence holds; -1 if none."""

    # -- state ---------------------------------------------------------------------------------------
    def save_seq(self, seq_id: int):
        """A copy of one sequence's cells and their K/V (an object with ``nbytes``), for ``load_seq``."""
        raise GGFlowError(f"{type(self).__name__} cannot save a sequence's state")

    def load_seq(self, seq_id: int, state) -> None:
        """Put back what ``save_seq`` copied, into free cells (remove the sequence first)."""
        raise GGFlowError(f"{type(self).__name__} cannot load a sequence's state")

    @property
    @abstractmethod
    def n_used(self) -> int:
        """Cells that hold a position."""

    @property
    def n_free(self) -> int:
        """Cells a batch can still be placed in."""
        return self.size - self.n_used
