"""nomic-bert: nomic-embed-text. The bert encoder with RoPE instead of learned positions, one fused QKV
projection, a SwiGLU FFN and no biases (llama.cpp's LLM_ARCH_NOMIC_BERT).

Token + token-type embeddings and a LayerNorm; per layer non-causal attention over the sequence with
NEOX RoPE on Q and K, then a SwiGLU FFN, each followed by a residual and a LayerNorm (post-norm).
No KV cache (``EncoderMemory``); pooling and a classifier head as bert's.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.arch_builtin.bert import Bert, classification_head
from ggflow.core import ops
from ggflow.core.encoder_memory import attend_within_ubatch
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.plugins.hookspecs import hookimpl


@dataclass(kw_only=True)
class NomicBertLayer:
    wqkv: Tensor = tensor("blk.{il}.attn_qkv.weight", lambda hp: (hp.n_embd, 3 * hp.n_embd))
    bqkv: Tensor | None = optional("blk.{il}.attn_qkv.bias", lambda hp: (3 * hp.n_embd,))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd, hp.n_embd))
    bo: Tensor | None = optional("blk.{il}.attn_output.bias", lambda hp: (hp.n_embd,))
    attn_out_norm: Tensor = tensor("blk.{il}.attn_output_norm.weight", lambda hp: (hp.n_embd,))
    attn_out_norm_b: Tensor = tensor("blk.{il}.attn_output_norm.bias", lambda hp: (hp.n_embd,))
    ffn_up: Tensor = tensor("blk.{il}.ffn_up.weight", lambda hp: (hp.n_embd, hp.n_ff))
    ffn_gate: Tensor = tensor("blk.{il}.ffn_gate.weight", lambda hp: (hp.n_embd, hp.n_ff))
    ffn_down: Tensor = tensor("blk.{il}.ffn_down.weight", lambda hp: (hp.n_ff, hp.n_embd))
    layer_out_norm: Tensor = tensor("blk.{il}.layer_output_norm.weight", lambda hp: (hp.n_embd,))
    layer_out_norm_b: Tensor = tensor("blk.{il}.layer_output_norm.bias", lambda hp: (hp.n_embd,))


@dataclass(kw_only=True)
class NomicBertWeights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    type_embd: Tensor | None = optional("token_types.weight", lambda hp: (hp.n_embd, hp.extra["n_token_types"]))
    tok_norm: Tensor = tensor("token_embd_norm.weight", lambda hp: (hp.n_embd,))
    tok_norm_b: Tensor = tensor("token_embd_norm.bias", lambda hp: (hp.n_embd,))
    layers: list[NomicBertLayer] = per_layer(NomicBertLayer)
    cls: Tensor | None = optional("cls.weight", lambda hp: (hp.n_embd, hp.n_embd))
    cls_b: Tensor | None = optional("cls.bias", lambda hp: (hp.n_embd,))
    cls_out: Tensor | None = optional("cls.output.weight", lambda hp: (hp.n_embd, hp.extra["n_cls_out"]))
    cls_out_b: Tensor | None = optional("cls.output.bias", lambda hp: (hp.extra["n_cls_out"],))


class NomicBert(Bert):
    """bert's hyperparameters, memory (none) and head; its own weights and layer."""
    names = ("nomic-bert",)
    weights = NomicBertWeights
    rope_type = ops.ROPE_NEOX

    def build_graph(self, b: GraphBuilder):
        w = b.w
        x = b.token_embeddings(w.tok_embd)                                       # [n_embd, n_tokens]
        if w.type_embd is not None:                    # every token is of type 0 ("sentence A"), as llama.cpp
            x = ops.add(x, ops.view(w.type_embd, (b.hp.n_embd,)))
        x = b.norm(x, w.tok_norm, w.tok_norm_b, Norm.LAYER)
        for il, layer in enumerate(w.layers):
            q, k, v = b.split_qkv(b.linear(x, layer.wqkv, layer.bqkv))            # [hd, n_head, n_tokens]
            q, k = b.rope(q), b.rope(k)
            cur = b.linear(attend_within_ubatch(b, q, k, v), layer.wo, layer.bo)
            if il == b.hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = b.norm(ops.add(x, cur), layer.attn_out_norm, layer.attn_out_norm_b, Norm.LAYER)   # post-norm
            cur = b.ffn(x, up=layer.ffn_up, gate=layer.ffn_gate, down=layer.ffn_down, kind=FFN.SILU_GATED)
            x = b.norm(ops.add(x, cur), layer.layer_out_norm, layer.layer_out_norm_b, Norm.LAYER)
        return classification_head(b, x)


@hookimpl
def register_architectures(register):
    register(NomicBert())
