"""Shared transformer building blocks: an architecture's graph is a short composition of these.

One GraphBuilder is made per graph build (per ubatch shape). It owns the graph inputs (token ids,
positions, KV-cache row indices, the attention mask, the ids of the tokens whose logits are wanted)
and gives blocks that read top to bottom as the model's math: embed, norm, project, RoPE, attend
over the KV cache, feed-forward, output. Shapes in comments are ggml's ne, innermost first.
"""
from __future__ import annotations

import math
from enum import Enum
from typing import TYPE_CHECKING

from ggflow.core import ops
from ggflow.core.graph import Graph
from ggflow.core.tensor import Tensor

if TYPE_CHECKING:
    from ggflow.core.memory import Memory
    from ggflow.core.model import Model


class Norm(Enum):
    RMS = "rms"        # x / rms(x) * w
    LAYER = "layer"    # (x - mean) / std * w + b


class FFN(Enum):
    SILU_GATED = "silu_gated"   # down(silu(gate(x)) * up(x)): llama, qwen
    GELU = "gelu"               # down(gelu(up(x))): gpt2


class GraphBuilder:
    def __init__(self, model: "Model", memory: "Memory", n_tokens: int, n_outputs: int, n_kv: int):
        self.model, self.hp, self.memory = model, model.hparams, memory
        self.n_tokens, self.n_outputs, self.n_kv = n_tokens, n_outputs, n_kv
        self.graph = Graph()
        self.inp_tokens = ops.new_input("I32", (n_tokens,), "inp_tokens")
        self.inp_pos = ops.new_input("I32", (n_tokens,), "inp_pos")
        self.inp_memory = memory.build_inputs(n_tokens, n_kv)   # KV cell indices and the mask
        self.inp_out_ids = ops.new_input("I32", (n_outputs,), "inp_out_ids")

    # -- weights -------------------------------------------------------------------------------
    def w(self, name: str) -> Tensor:
        return self.model.weight(name)

    def w_opt(self, name: str) -> Tensor | None:
        return self.model.get(name)

    # -- blocks --------------------------------------------------------------------------------
    def token_embeddings(self) -> Tensor:
        return ops.get_rows(self.w("token_embd.weight"), self.inp_tokens)        # [n_embd, n_tokens]

    def position_embeddings(self) -> Tensor:
        return ops.get_rows(self.w("position_embd.weight"), self.inp_pos)        # [n_embd, n_tokens]

    def norm(self, x: Tensor, weight: str, kind: Norm) -> Tensor:
        """Normalize each row of x, then scale (and for LayerNorm shift) by the named weight (+ .bias)."""
        if kind is Norm.RMS:
            x = ops.rms_norm(x, self.hp.norm_rms_eps)
        else:
            x = ops.norm(x, self.hp.norm_eps)
        x = ops.mul(x, self.w(f"{weight}.weight"))
        bias = self.w_opt(f"{weight}.bias")
        return ops.add(x, bias) if bias is not None else x

    def linear(self, x: Tensor, weight: str) -> Tensor:
        """x @ W^T (+ b): the named weight's rows are output features; the bias is optional."""
        y = ops.mul_mat(self.w(f"{weight}.weight"), x)
        bias = self.w_opt(f"{weight}.bias")
        return ops.add(y, bias) if bias is not None else y

    def rope(self, x: Tensor) -> Tensor:
        """Rotate the first n_rot dims of each head of x [head_dim, n_head, n_tokens] by its position."""
        hp = self.hp
        return ops.rope(x, self.inp_pos, hp.n_rot, hp.rope_type, freq_base=hp.rope_freq_base,
                        freq_scale=hp.rope_freq_scale, n_ctx_orig=hp.n_ctx_train,
                        freq_factors=self.w_opt("rope_freqs.weight"))

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor, kq_scale: float | None = None) -> Tensor:
        """Write this ubatch's K/V into the memory, attend over its first n_kv cells.

        q [head_dim, n_head, n_tokens], k and v [head_dim, n_head_kv, n_tokens] -> [n_embd_v, n_tokens].
        """
        mem, inp = self.memory, self.inp_memory
        # The writes are expanded first so every read below comes after them in the graph order.
        self.graph.expand(mem.cpy_k(il, k, inp.kv_idxs))
        self.graph.expand(mem.cpy_v(il, v, inp.kv_idxs))
        keys, values = mem.get_k(il, self.n_kv), mem.get_v(il, self.n_kv)    # [hd, n_head_kv, n_kv]
        q = ops.permute(q, 0, 2, 1, 3)                                           # [hd, n_tokens, n_head]
        keys = ops.permute(keys, 0, 2, 1, 3)                                     # [hd, n_kv, n_head_kv]
        kq = ops.mul_mat(keys, q)                                                # [n_kv, n_tokens, n_head]
        scale = kq_scale if kq_scale is not None else 1.0 / math.sqrt(self.hp.n_embd_head_k)
        kq = ops.soft_max(kq, inp.kq_mask, scale)
        values = ops.permute(values, 1, 2, 0, 3)                                 # [n_kv, hd_v, n_head_kv]
        kqv = ops.mul_mat(values, kq)                                            # [hd_v, n_tokens, n_head]
        out = ops.cont(ops.permute(kqv, 0, 2, 1, 3))                             # [hd_v, n_head, n_tokens]
        return ops.reshape(out, self.hp.n_embd_head_v * self.hp.n_head, self.n_tokens)

    def ffn(self, x: Tensor, il: int, kind: FFN) -> Tensor:
        p = f"blk.{il}"
        if kind is FFN.SILU_GATED:
            return self.linear(ops.mul(ops.silu(self.linear(x, f"{p}.ffn_gate")), self.linear(x, f"{p}.ffn_up")),
                               f"{p}.ffn_down")
        return self.linear(ops.gelu(self.linear(x, f"{p}.ffn_up")), f"{p}.ffn_down")

    def select_outputs(self, *xs: Tensor) -> tuple[Tensor, ...]:
        """Keep only the tokens whose logits are wanted (done before the last FFN, as llama.cpp does)."""
        if self.n_outputs == self.n_tokens:
            return xs
        return tuple(ops.get_rows(x, self.inp_out_ids) for x in xs)

    def lm_head(self, x: Tensor) -> Tensor:
        """Logits [n_vocab, n_outputs]; a model without output.weight ties it to the token embedding."""
        w = self.w_opt("output.weight") or self.w("token_embd.weight")
        return ops.mul_mat(w, x)

    def split_heads(self, x: Tensor, head_dim: int) -> Tensor:
        """[head_dim * n, n_tokens] -> [head_dim, n, n_tokens]."""
        return ops.reshape(x if x.is_contiguous() else ops.cont(x), head_dim, x.ne[0] // head_dim, self.n_tokens)

    def finish(self, logits: Tensor) -> Graph:
        logits.name = "result_output"
        self.graph.mark_output(logits)
        return self.graph
