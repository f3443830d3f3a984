"""Re-rotate cached keys after seq_add moved their positions.

RoPE rotations compose: rotating a key already rotated for position p by a further delta gives the key
for p + delta. So a position shift is one rope op per layer over the whole K cache, with each cell's
pending shift as its "position", written back in place (as llama.cpp's K-shift does).
"""
from __future__ import annotations

from typing import Sequence

from ggflow.core import ops
from ggflow.core.backend import Backend
from ggflow.core.graph import Graph
from ggflow.core.memory import KVCache
from ggflow.core.scheduler import Scheduler


def apply_k_shift(kv: KVCache, backends: Sequence[Backend]) -> None:
    hp = kv.hp
    shift = ops.new_input("I32", (kv.size,), "inp_k_shift")
    graph = Graph()
    for k in kv.k:
        keys = ops.view(k, (hp.n_embd_head_k, hp.n_head_kv, kv.size),
                        (k.nb[0], k.type.row_bytes(hp.n_embd_head_k), k.nb[1]))
        rotated = ops.rope(ops.cont(keys), shift, hp.n_rot, hp.rope_type, freq_base=hp.rope_freq_base,
                           freq_scale=hp.rope_freq_scale, n_ctx_orig=hp.n_ctx_train)
        graph.expand(ops.cpy(rotated, keys))
    scheduler = Scheduler(backends)
    scheduler.alloc(graph)
    scheduler.set_input(shift, kv.shift)
    scheduler.compute(graph)
    kv.shift[:] = 0
