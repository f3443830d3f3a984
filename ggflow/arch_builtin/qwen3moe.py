"""qwen3moe: qwen3's attention (QK-norm, NEOX RoPE) with a mixture of experts in place of every FFN.

Each token's router (ffn_gate_inp) takes the softmax over n_expert experts, keeps the top n_expert_used
and divides their probabilities by their sum (llama.cpp's qwen3moe always normalises); the chosen SwiGLU
experts' outputs are summed with those weights (Qwen3-30B-A3B: 128 experts, 8 used).
"""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.experts import Gating, experts_of, load_experts, n_expert, n_ff_exp
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.plugins.hookspecs import hookimpl


@dataclass(kw_only=True)
class Qwen3MoeLayer:
    attn_norm: Tensor = tensor("blk.{il}.attn_norm.weight", lambda hp: (hp.n_embd,))
    wq: Tensor = tensor("blk.{il}.attn_q.weight", lambda hp: (hp.n_embd, hp.n_embd_head_k * hp.n_head))
    wk: Tensor = tensor("blk.{il}.attn_k.weight", lambda hp: (hp.n_embd, hp.n_embd_k_gqa))
    wv: Tensor = tensor("blk.{il}.attn_v.weight", lambda hp: (hp.n_embd, hp.n_embd_v_gqa))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd_head_v * hp.n_head, hp.n_embd))
    attn_q_norm: Tensor = tensor("blk.{il}.attn_q_norm.weight", lambda hp: (hp.n_embd_head_k,))
    attn_k_norm: Tensor = tensor("blk.{il}.attn_k_norm.weight", lambda hp: (hp.n_embd_head_k,))
    ffn_norm: Tensor = tensor("blk.{il}.ffn_norm.weight", lambda hp: (hp.n_embd,))
    ffn_gate_inp: Tensor = tensor("blk.{il}.ffn_gate_inp.weight", lambda hp: (hp.n_embd, n_expert(hp)))
    ffn_gate_exps: Tensor = tensor("blk.{il}.ffn_gate_exps.weight", lambda hp: (hp.n_embd, n_ff_exp(hp), n_expert(hp)))
    ffn_up_exps: Tensor = tensor("blk.{il}.ffn_up_exps.weight", lambda hp: (hp.n_embd, n_ff_exp(hp), n_expert(hp)))
    ffn_down_exps: Tensor = tensor("blk.{il}.ffn_down_exps.weight", lambda hp: (n_ff_exp(hp), hp.n_embd, n_expert(hp)))


@dataclass(kw_only=True)
class Qwen3MoeWeights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    layers: list[Qwen3MoeLayer] = per_layer(Qwen3MoeLayer)
    output_norm: Tensor = tensor("output_norm.weight", lambda hp: (hp.n_embd,))
    output: Tensor | None = optional("output.weight", lambda hp: (hp.n_embd, hp.n_vocab))


class Qwen3Moe(Architecture):
    names = ("qwen3moe",)
    weights = Qwen3MoeWeights
    rope_type = ops.ROPE_NEOX

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = super().load_hparams(meta)
        hp.extra["experts"] = load_experts(meta, hp.n_ff, required=True, gating=Gating.SOFTMAX, norm_weights=True)
        return hp

    def build_graph(self, b: GraphBuilder):
        w, experts = b.w, experts_of(b.hp)
        x = b.token_embeddings(w.tok_embd)                                        # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(b.norm(x, layer.attn_norm, None, Norm.RMS), layer)    # [hd, n_head(_kv), n_tokens]
            q = b.rope(b.norm(q, layer.attn_q_norm, None, Norm.RMS))              # per head
            k = b.rope(b.norm(k, layer.attn_k_norm, None, Norm.RMS))
            attn = b.linear(b.attention(il, q, k, v), layer.wo)                   # [n_embd, n_tokens]
            if il == b.hp.n_layer - 1:
                attn, x = b.select_outputs(attn, x)
            x = ops.add(x, attn)                                                  # residual
            x = ops.add(x, b.moe_ffn(b.norm(x, layer.ffn_norm, None, Norm.RMS), experts, kind=FFN.SILU_GATED,
                                     gate_inp=layer.ffn_gate_inp, up_exps=layer.ffn_up_exps,
                                     gate_exps=layer.ffn_gate_exps, down_exps=layer.ffn_down_exps))
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        return b.lm_head(x, w.output or w.tok_embd)                               # [n_vocab, n_outputs]


@hookimpl
def register_architectures(register):
    register(Qwen3Moe())
