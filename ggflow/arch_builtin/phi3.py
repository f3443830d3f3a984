"""phi3: Phi-3 / Phi-3.5 / Phi-4-mini. llama's block with Q, K and V in one matrix, gate|up in one matrix
(SwiGLU over its two halves), NEOX RoPE, and LongRoPE: per-pair frequency factors, the long ones where the
context is longer than the original training context (``rope.scaling.original_context_length``), the
short ones otherwise, as llama.cpp chooses them (by the context's size, not the prompt's), and the rotated
values scaled by ``rope.scaling.attn_factor``. Q is scaled by 1/sqrt(head_dim) before attention, as
llama.cpp does it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.graph_builder import GraphBuilder, Norm, column_rows
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.plugins.hookspecs import hookimpl


@dataclass(kw_only=True)
class Phi3Layer:
    attn_norm: Tensor = tensor("blk.{il}.attn_norm.weight", lambda hp: (hp.n_embd,))
    wqkv: Tensor = tensor("blk.{il}.attn_qkv.weight",
                          lambda hp: (hp.n_embd, hp.n_embd_head_k * hp.n_head + hp.n_embd_k_gqa + hp.n_embd_v_gqa))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd_head_v * hp.n_head, hp.n_embd))
    ffn_norm: Tensor = tensor("blk.{il}.ffn_norm.weight", lambda hp: (hp.n_embd,))
    ffn_up: Tensor = tensor("blk.{il}.ffn_up.weight", lambda hp: (hp.n_embd, 2 * hp.n_ff))    # gate | up
    ffn_down: Tensor = tensor("blk.{il}.ffn_down.weight", lambda hp: (hp.n_ff, hp.n_embd))


@dataclass(kw_only=True)
class Phi3Weights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    rope_long: Tensor | None = optional("rope_factors_long.weight", lambda hp: (hp.n_rot // 2,))
    rope_short: Tensor | None = optional("rope_factors_short.weight", lambda hp: (hp.n_rot // 2,))
    layers: list[Phi3Layer] = per_layer(Phi3Layer)
    output_norm: Tensor = tensor("output_norm.weight", lambda hp: (hp.n_embd,))
    output: Tensor | None = optional("output.weight", lambda hp: (hp.n_embd, hp.n_vocab))


class Phi3(Architecture):
    names = ("phi3",)
    weights = Phi3Weights
    rope_type = ops.ROPE_NEOX

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = super().load_hparams(meta)
        key = meta.arch_key
        hp.extra["n_ctx_orig"] = meta.get_int(key("rope.scaling.original_context_length"), hp.n_ctx_train, min=1)
        hp.extra["rope_attn_factor"] = meta.get_float(key("rope.scaling.attn_factor"), 1.0, min=0.0)
        return hp

    def build_graph(self, b: GraphBuilder):
        hp, w = b.hp, b.w
        long_context = getattr(b.memory, "size", 0) > hp.extra["n_ctx_orig"]
        factors = w.rope_long if long_context else w.rope_short
        attn_factor = hp.extra["rope_attn_factor"]
        x = b.token_embeddings(w.tok_embd)                                        # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            qkv = b.linear(b.norm(x, layer.attn_norm, None, Norm.RMS), layer.wqkv)  # [q | k | v, n_tokens]
            q, k, v = b.split_qkv(qkv)
            q = b.rope(q, factors, attn_factor=attn_factor)
            k = b.rope(k, factors, attn_factor=attn_factor)
            q = ops.scale(q, 1.0 / math.sqrt(hp.n_embd_head_k))
            cur = b.linear(b.attention(il, q, k, v, kq_scale=1.0), layer.wo)      # [n_embd, n_tokens]
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(cur, x)                                                   # residual
            h = b.linear(b.norm(x, layer.ffn_norm, None, Norm.RMS), layer.ffn_up)   # [2 n_ff, n]: gate | up
            h = ops.mul(ops.silu(column_rows(h, 0, hp.n_ff)), column_rows(h, hp.n_ff, hp.n_ff))   # SwiGLU over the halves
            x = ops.add(x, b.linear(h, layer.ffn_down))                           # residual
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        return b.lm_head(x, w.output or w.tok_embd)                               # [n_vocab, n_outputs]


@hookimpl
def register_architectures(register):
    register(Phi3())
