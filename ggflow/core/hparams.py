"""HParams: the hyperparameters an architecture reads from a GGUF file's metadata (as llama_hparams is).

Its own module, beneath everything that sizes a graph or a cache by it (arch, weights, kv_cache,
placement, experts), so none of them imports the model loader to get it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class HParams:
    """The hyperparameters every built-in architecture is described by (as llama_hparams is)."""
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int = 0                   # dims of each head that RoPE rotates (0: no RoPE)
    rope_type: int = -1              # ops.ROPE_NORMAL / ops.ROPE_NEOX / -1 none
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    norm_eps: float = 1e-5           # LayerNorm
    norm_rms_eps: float = 1e-5       # RMSNorm
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv
