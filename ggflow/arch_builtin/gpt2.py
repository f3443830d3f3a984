"""gpt2: LayerNorm with bias, learned position embeddings, fused QKV projection, GELU FFN, no RoPE."""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.plugins.hookspecs import hookimpl


@dataclass(kw_only=True)
class GPT2Layer:
    attn_norm: Tensor = tensor("blk.{il}.attn_norm.weight", lambda hp: (hp.n_embd,))
    attn_norm_b: Tensor = tensor("blk.{il}.attn_norm.bias", lambda hp: (hp.n_embd,))
    wqkv: Tensor = tensor("blk.{il}.attn_qkv.weight", lambda hp: (hp.n_embd, 3 * hp.n_embd))
    bqkv: Tensor = tensor("blk.{il}.attn_qkv.bias", lambda hp: (3 * hp.n_embd,))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd, hp.n_embd))
    bo: Tensor = tensor("blk.{il}.attn_output.bias", lambda hp: (hp.n_embd,))
    ffn_norm: Tensor = tensor("blk.{il}.ffn_norm.weight", lambda hp: (hp.n_embd,))
    ffn_norm_b: Tensor = tensor("blk.{il}.ffn_norm.bias", lambda hp: (hp.n_embd,))
    ffn_up: Tensor = tensor("blk.{il}.ffn_up.weight", lambda hp: (hp.n_embd, hp.n_ff))
    ffn_up_b: Tensor = tensor("blk.{il}.ffn_up.bias", lambda hp: (hp.n_ff,))
    ffn_down: Tensor = tensor("blk.{il}.ffn_down.weight", lambda hp: (hp.n_ff, hp.n_embd))
    ffn_down_b: Tensor = tensor("blk.{il}.ffn_down.bias", lambda hp: (hp.n_embd,))


@dataclass(kw_only=True)
class GPT2Weights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    pos_embd: Tensor = tensor("position_embd.weight", lambda hp: (hp.n_embd, hp.n_ctx_train))
    layers: list[GPT2Layer] = per_layer(GPT2Layer)
    output_norm: Tensor = tensor("output_norm.weight", lambda hp: (hp.n_embd,))
    output_norm_b: Tensor = tensor("output_norm.bias", lambda hp: (hp.n_embd,))
    output: Tensor | None = optional("output.weight", lambda hp: (hp.n_embd, hp.n_vocab))


class GPT2(Architecture):
    names = ("gpt2",)
    weights = GPT2Weights
    norm_eps_key = "attention.layer_norm_epsilon"   # LayerNorm, not RMSNorm

    def build_graph(self, b: GraphBuilder):
        hp, w = b.hp, b.w
        e, hd = hp.n_embd, hp.n_embd_head_k
        x = ops.add(b.token_embeddings(w.tok_embd), b.position_embeddings(w.pos_embd))  # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            cur = b.norm(x, layer.attn_norm, layer.attn_norm_b, Norm.LAYER)
            qkv = b.linear(cur, layer.wqkv, layer.bqkv)                           # [3 n_embd, n_tokens]
            q, k, v = (ops.view(qkv, (e, b.n_tokens), (qkv.nb[0], qkv.nb[1]), offset=i * e * qkv.nb[0])
                       for i in range(3))
            q, k, v = (b.split_heads(t, hd) for t in (q, k, v))                    # [hd, n_head, n_tokens]
            cur = b.linear(b.attention(il, q, k, v), layer.wo, layer.bo)
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(x, cur)                                                   # residual
            cur = b.norm(x, layer.ffn_norm, layer.ffn_norm_b, Norm.LAYER)
            cur = b.ffn(cur, up=layer.ffn_up, up_b=layer.ffn_up_b, down=layer.ffn_down, down_b=layer.ffn_down_b,
                        kind=FFN.GELU)
            x = ops.add(x, cur)                                                   # residual
        x = b.norm(x, w.output_norm, w.output_norm_b, Norm.LAYER)
        return b.lm_head(x, w.output or w.tok_embd)                               # [n_vocab, n_outputs]


@hookimpl
def register_architectures(register):
    register(GPT2())
