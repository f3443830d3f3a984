"""Where a Context's memory lives: on the first backend that can write it.

The KV cache is written in place (set_rows into its cells), and an in-place write runs where the memory
is, so the memory must live on a backend that supports those writes for its types. llama.cpp allocates
each layer's cache on the device of that layer; ggflow keeps one memory on one backend: the first, in
the scheduler's order, that can write F32 rows into both the K and the V type; the last (the CPU,
which runs every op) otherwise. Reads of the cache (the attention matmuls) may run elsewhere: the
scheduler copies the views they read, and counts it (``Scheduler.stats``).
"""
from __future__ import annotations

from typing import Sequence

from ggflow.core import ops
from ggflow.core.backend import Backend
from ggflow.core.hparams import HParams
from ggflow.core.tensor import Tensor, TensorFlag


def kv_writes(hp: HParams, n_ctx: int, n_ubatch: int, type_k: str, type_v: str) -> list[Tensor]:
    """The writes a ubatch makes into a unified cache of n_ctx cells, as nodes (no memory) to ask about."""
    idxs = ops.new_input("I32", (n_ubatch,), "probe_kv_idxs")
    return [ops.set_rows(Tensor(kind, (n_embd, n_ctx), name=f"probe_cache_{name}", flags=TensorFlag.PARAM),
                         ops.new_input("F32", (n_embd, n_ubatch), f"probe_{name}_cur"), idxs)
            for name, kind, n_embd in (("k", type_k, hp.n_embd_k_gqa), ("v", type_v, hp.n_embd_v_gqa))]


def memory_backend(backends: Sequence[Backend], writes: Sequence[Tensor]) -> Backend:
    """The first backend that supports every write; the last (the fallback) if none does."""
    return next((b for b in backends[:-1] if all(b.supports_op(w) for w in writes)), backends[-1])


__all__ = ["kv_writes", "memory_backend"]
