"""Re-rotate cached keys after seq_add moved their positions.

RoPE rotations compose: rotating a key already rotated for position p by a further delta gives the key
for p + delta. So a position shift is one rope op per layer over the whole K cache, with each cell's
pending shift as its "position", written back in place (as llama.cpp's K-shift does). The graph runs on
the scheduler it is given (the Context's), so it shares that scheduler's compute buffers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggflow.core import ops
from ggflow.core.graph import Graph
from ggflow.core.scheduler import Scheduler

if TYPE_CHECKING:
    from ggflow.core.kv_cache import KVCache


def apply_k_shift(kv: "KVCache", scheduler: Scheduler) -> None:
    hp = kv.hp
    shift = ops.new_input("I32", (kv.size,), "inp_k_shift")
    graph = Graph()
    for il in kv.layers:
        keys = kv.get_k(il, kv.size)
        freq_base, freq_scale = kv.layer_rope[il]
        rotated = ops.rope(ops.cont(keys), shift, hp.n_rot, hp.rope_type, freq_base=freq_base,
                           freq_scale=freq_scale, n_ctx_orig=hp.n_ctx_train)
        graph.expand(ops.cpy(rotated, keys))
    scheduler.alloc(graph)
    scheduler.set_input(shift, kv.shift)
    scheduler.compute(graph)
    scheduler.forget(graph)   # run once: nothing to keep it ready for
