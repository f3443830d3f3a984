"""What a context of n_ctx tokens costs in memory, worked out before anything is allocated.

The KV cache is exact (every layer's K and V rows for each of its cells, in the cache types: n_ctx cells, or
what the architecture's ``kv_cells`` says, e.g. a window-sized cache for sliding-window layers; each rounded up to
whole CELL_PAGE pages, as the KV cache allocates them); the compute buffer is
an upper estimate of one ubatch's largest live tensors at a full context (logits, the attention scores and
their softmax, the layer activations). A context that needs more than the memory available is refused with
both figures, instead of ending in an allocation failure deep inside numpy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ggflow.errors import ContextMemoryError

_F32 = 4


@dataclass(frozen=True)
class ContextMemory:
    kv_bytes: int
    compute_bytes: int

    @property
    def total(self) -> int:
        return self.kv_bytes + self.compute_bytes


def estimate_context_memory(hparams, n_ctx: int, n_ubatch: int, type_k: str = "F16",
                            type_v: str = "F16", cells: list[int] | None = None) -> ContextMemory:
    """cells: the cells each layer keeps (``Architecture.kv_cells``); None: n_ctx for every layer."""
    from ggflow.core.memory import page_cells
    from ggflow.core.types import type_traits

    hp = hparams
    k_row = type_traits(type_k).row_bytes(hp.n_embd_k_gqa)
    v_row = type_traits(type_v).row_bytes(hp.n_embd_v_gqa)
    kv = sum(page_cells(c) for c in cells or [n_ctx] * hp.n_layer) * (k_row + v_row)
    n_ub = max(1, min(n_ubatch, n_ctx))
    scores = 2 * hp.n_head * n_ub * n_ctx * _F32                 # KQ and softmax(KQ)
    activations = n_ub * (6 * hp.n_embd + 3 * hp.n_ff) * _F32    # residual, norms, QKV, FFN gate/up/down
    logits = n_ub * hp.n_vocab * _F32
    return ContextMemory(kv, scores + activations + logits)


def available_memory() -> int | None:
    """Bytes the system can still give (MemAvailable), or None where that cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    if n >= 2**28:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def check_context_fits(hparams, n_ctx: int, n_ubatch: int, type_k: str = "F16", type_v: str = "F16",
                       available: int | None = None, cells: list[int] | None = None) -> ContextMemory:
    """The estimate, or ContextMemoryError when it exceeds the memory available."""
    need = estimate_context_memory(hparams, n_ctx, n_ubatch, type_k, type_v, cells)
    available = available_memory() if available is None else available
    if available is not None and need.total > available:
        raise ContextMemoryError(
            f"n_ctx={n_ctx} needs {_gib(need.total)} (KV cache {_gib(need.kv_bytes)} + compute buffers "
            f"{_gib(need.compute_bytes)}) but {_gib(available)} of memory is available: use a smaller n_ctx "
            f"(or type_k/type_v='Q8_0' to halve the KV cache)")
    return need
