"""llama: RMSNorm, RoPE (ggml's normal mode, as GGUF stores Q/K), grouped-query attention, SwiGLU FFN.

Covers Llama 2/3, SmolLM, Mistral-style files: optional Q/K/V/O and FFN biases, optional rope_freqs
(Llama 3 scaling), output tied to the token embedding when the file has no output.weight. A file with
``llama.expert_count`` (Mixtral) has a mixture of SwiGLU experts in place of each FFN: softmax router,
top n_expert_used, their weights normalised to sum to 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.experts import experts_of, has_experts, is_dense, load_experts, n_expert
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.plugins.hookspecs import hookimpl


@dataclass(kw_only=True)
class LlamaLayer:
    attn_norm: Tensor = tensor("blk.{il}.attn_norm.weight", lambda hp: (hp.n_embd,))
    wq: Tensor = tensor("blk.{il}.attn_q.weight", lambda hp: (hp.n_embd, hp.n_embd_head_k * hp.n_head))
    wk: Tensor = tensor("blk.{il}.attn_k.weight", lambda hp: (hp.n_embd, hp.n_embd_k_gqa))
    wv: Tensor = tensor("blk.{il}.attn_v.weight", lambda hp: (hp.n_embd, hp.n_embd_v_gqa))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd_head_v * hp.n_head, hp.n_embd))
    bq: Tensor | None = optional("blk.{il}.attn_q.bias", lambda hp: (hp.n_embd_head_k * hp.n_head,))
    bk: Tensor | None = optional("blk.{il}.attn_k.bias", lambda hp: (hp.n_embd_k_gqa,))
    bv: Tensor | None = optional("blk.{il}.attn_v.bias", lambda hp: (hp.n_embd_v_gqa,))
    bo: Tensor | None = optional("blk.{il}.attn_output.bias", lambda hp: (hp.n_embd,))
    ffn_norm: Tensor = tensor("blk.{il}.ffn_norm.weight", lambda hp: (hp.n_embd,))
    ffn_gate: Tensor = tensor("blk.{il}.ffn_gate.weight", lambda hp: (hp.n_embd, hp.n_ff), when=is_dense)
    ffn_up: Tensor = tensor("blk.{il}.ffn_up.weight", lambda hp: (hp.n_embd, hp.n_ff), when=is_dense)
    ffn_down: Tensor = tensor("blk.{il}.ffn_down.weight", lambda hp: (hp.n_ff, hp.n_embd), when=is_dense)
    ffn_gate_b: Tensor | None = optional("blk.{il}.ffn_gate.bias", lambda hp: (hp.n_ff,), when=is_dense)
    ffn_up_b: Tensor | None = optional("blk.{il}.ffn_up.bias", lambda hp: (hp.n_ff,), when=is_dense)
    ffn_down_b: Tensor | None = optional("blk.{il}.ffn_down.bias", lambda hp: (hp.n_embd,), when=is_dense)
    # experts (Mixtral), each [n_embd, n_ff] as the dense FFN's, one per expert along ne[2]
    ffn_gate_inp: Tensor = tensor("blk.{il}.ffn_gate_inp.weight", lambda hp: (hp.n_embd, n_expert(hp)),
                                  when=has_experts)
    ffn_gate_exps: Tensor | None = optional("blk.{il}.ffn_gate_exps.weight",
                                            lambda hp: (hp.n_embd, hp.n_ff, n_expert(hp)), when=has_experts)
    ffn_up_exps: Tensor = tensor("blk.{il}.ffn_up_exps.weight", lambda hp: (hp.n_embd, hp.n_ff, n_expert(hp)),
                                 when=has_experts)
    ffn_down_exps: Tensor = tensor("blk.{il}.ffn_down_exps.weight", lambda hp: (hp.n_ff, hp.n_embd, n_expert(hp)),
                                   when=has_experts)


@dataclass(kw_only=True)
class LlamaWeights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    rope_freqs: Tensor | None = optional("rope_freqs.weight", lambda hp: (hp.n_rot // 2,))
    layers: list[LlamaLayer] = per_layer(LlamaLayer)
    output_norm: Tensor = tensor("output_norm.weight", lambda hp: (hp.n_embd,))
    output: Tensor | None = optional("output.weight", lambda hp: (hp.n_embd, hp.n_vocab))


def llama_ffn(b: GraphBuilder, cur: Tensor, layer: LlamaLayer) -> Tensor:
    """The block's SiLU-gated FFN: Mixtral's experts where the file has them, else the dense one."""
    if has_experts(b.hp):
        return b.moe_ffn(cur, experts_of(b.hp), kind=FFN.SILU_GATED, gate_inp=layer.ffn_gate_inp,
                         up_exps=layer.ffn_up_exps, gate_exps=layer.ffn_gate_exps, down_exps=layer.ffn_down_exps)
    return b.ffn(cur, up=layer.ffn_up, gate=layer.ffn_gate, down=layer.ffn_down, kind=FFN.SILU_GATED,
                 up_b=layer.ffn_up_b, gate_b=layer.ffn_gate_b, down_b=layer.ffn_down_b)


class Llama(Architecture):
    names = ("llama",)
    weights = LlamaWeights
    rope_type = ops.ROPE_NORMAL

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = super().load_hparams(meta)
        hp.extra["experts"] = load_experts(meta, hp.n_ff, required=False, norm_weights=True, n_ff_exp_key=None)
        return hp

    def build_graph(self, b: GraphBuilder):
        hp, w = b.hp, b.w
        x = b.token_embeddings(w.tok_embd)                                        # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            cur = b.norm(x, layer.attn_norm, None, Norm.RMS)
            q, k, v = b.qkv(cur, layer)                                           # [hd, n_head(_kv), n_tokens]
            q, k = b.rope(q, w.rope_freqs), b.rope(k, w.rope_freqs)
            cur = b.linear(b.attention(il, q, k, v), layer.wo, layer.bo)          # [n_embd, n_tokens]
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(x, cur)                                                   # residual
            cur = b.norm(x, layer.ffn_norm, None, Norm.RMS)
            cur = llama_ffn(b, cur, layer)
            x = ops.add(x, cur)                                                   # residual
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        return b.lm_head(x, w.output or w.tok_embd)                               # [n_vocab, n_outputs]


@hookimpl
def register_architectures(register):
    register(Llama())
