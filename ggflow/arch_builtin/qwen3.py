"""qwen3: llama's block with NEOX-mode RoPE and an RMSNorm over each head of Q and of K before RoPE."""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.tensor import Tensor
from ggflow.core.weights import per_layer, tensor
from ggflow.arch_builtin.llama import LlamaLayer, LlamaWeights
from ggflow.plugins.hookspecs import hookimpl


@dataclass(kw_only=True)
class Qwen3Layer(LlamaLayer):
    attn_q_norm: Tensor = tensor("blk.{il}.attn_q_norm.weight", lambda hp: (hp.n_embd_head_k,))
    attn_k_norm: Tensor = tensor("blk.{il}.attn_k_norm.weight", lambda hp: (hp.n_embd_head_k,))


@dataclass(kw_only=True)
class Qwen3Weights(LlamaWeights):
    layers: list[Qwen3Layer] = per_layer(Qwen3Layer)


class Qwen3(Architecture):
    names = ("qwen3",)
    weights = Qwen3Weights
    rope_type = ops.ROPE_NEOX

    def build_graph(self, b: GraphBuilder):
        w = b.w
        x = b.token_embeddings(w.tok_embd)                                        # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(b.norm(x, layer.attn_norm, None, Norm.RMS), layer)    # [hd, n_head(_kv), n_tokens]
            q = b.rope(b.norm(q, layer.attn_q_norm, None, Norm.RMS), w.rope_freqs)  # per head
            k = b.rope(b.norm(k, layer.attn_k_norm, None, Norm.RMS), w.rope_freqs)
            attn = b.linear(b.attention(il, q, k, v), layer.wo, layer.bo)         # [n_embd, n_tokens]
            if il == b.hp.n_layer - 1:
                attn, x = b.select_outputs(attn, x)
            x = ops.add(x, attn)                                                  # residual
            x = ops.add(x, b.ffn(b.norm(x, layer.ffn_norm, None, Norm.RMS), kind=FFN.SILU_GATED,
                                 up=layer.ffn_up, gate=layer.ffn_gate, down=layer.ffn_down,
                                 up_b=layer.ffn_up_b, gate_b=layer.ffn_gate_b, down_b=layer.ffn_down_b))
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        return b.lm_head(x, w.output or w.tok_embd)                               # [n_vocab, n_outputs]


@hookimpl
def register_architectures(register):
    register(Qwen3())
