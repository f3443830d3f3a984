"""bert: BERT, MiniLM, bge. An encoder: token + token-type + learned position embeddings, LayerNorm,
then per layer non-causal attention and a GELU FFN, each followed by a residual and a LayerNorm (post-norm).

It keeps no KV cache (``EncoderMemory``): each sequence is read whole and attends to all of itself. The
graph's result is the hidden states (pooled on the host: mean, cls, last) or, when logits are asked for
and the file has a classification head (a reranker), ggml's head on the outputs: ``cls`` (dense + tanh,
where present) then ``cls.output``: one relevance score per output token (the CLS token of each pair).
"""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import LAYER_EPS, Architecture, load_common_hparams
from ggflow.core.encoder_memory import EncoderMemory, attend_within_ubatch
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.errors import ModelLoadError
from ggflow.plugins.hookspecs import hookimpl

POOLING = ("none", "mean", "cls", "last", "rank")   # {arch}.pooling_type, as llama.cpp numbers it (0 .. 4)


@dataclass(kw_only=True)
class BertLayer:
    wq: Tensor = tensor("blk.{il}.attn_q.weight", lambda hp: (hp.n_embd, hp.n_embd))
    bq: Tensor = tensor("blk.{il}.attn_q.bias", lambda hp: (hp.n_embd,))
    wk: Tensor = tensor("blk.{il}.attn_k.weight", lambda hp: (hp.n_embd, hp.n_embd))
    bk: Tensor = tensor("blk.{il}.attn_k.bias", lambda hp: (hp.n_embd,))
    wv: Tensor = tensor("blk.{il}.attn_v.weight", lambda hp: (hp.n_embd, hp.n_embd))
    bv: Tensor = tensor("blk.{il}.attn_v.bias", lambda hp: (hp.n_embd,))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd, hp.n_embd))
    bo: Tensor | None = optional("blk.{il}.attn_output.bias", lambda hp: (hp.n_embd,))
    attn_out_norm: Tensor = tensor("blk.{il}.attn_output_norm.weight", lambda hp: (hp.n_embd,))
    attn_out_norm_b: Tensor = tensor("blk.{il}.attn_output_norm.bias", lambda hp: (hp.n_embd,))
    ffn_up: Tensor = tensor("blk.{il}.ffn_up.weight", lambda hp: (hp.n_embd, hp.n_ff))
    ffn_up_b: Tensor | None = optional("blk.{il}.ffn_up.bias", lambda hp: (hp.n_ff,))
    ffn_down: Tensor = tensor("blk.{il}.ffn_down.weight", lambda hp: (hp.n_ff, hp.n_embd))
    ffn_down_b: Tensor | None = optional("blk.{il}.ffn_down.bias", lambda hp: (hp.n_embd,))
    layer_out_norm: Tensor = tensor("blk.{il}.layer_output_norm.weight", lambda hp: (hp.n_embd,))
    layer_out_norm_b: Tensor = tensor("blk.{il}.layer_output_norm.bias", lambda hp: (hp.n_embd,))


@dataclass(kw_only=True)
class BertWeights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    type_embd: Tensor | None = optional("token_types.weight", lambda hp: (hp.n_embd, hp.extra["n_token_types"]))
    pos_embd: Tensor = tensor("position_embd.weight", lambda hp: (hp.n_embd, hp.n_ctx_train))
    tok_norm: Tensor = tensor("token_embd_norm.weight", lambda hp: (hp.n_embd,))
    tok_norm_b: Tensor = tensor("token_embd_norm.bias", lambda hp: (hp.n_embd,))
    layers: list[BertLayer] = per_layer(BertLayer)
    cls: Tensor | None = optional("cls.weight", lambda hp: (hp.n_embd, hp.n_embd))
    cls_b: Tensor | None = optional("cls.bias", lambda hp: (hp.n_embd,))
    cls_out: Tensor | None = optional("cls.output.weight", lambda hp: (hp.n_embd, hp.extra["n_cls_out"]))
    cls_out_b: Tensor | None = optional("cls.output.bias", lambda hp: (hp.extra["n_cls_out"],))


class Bert(Architecture):
    names = ("bert",)
    weights = BertWeights
    norm_eps_key = LAYER_EPS

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = load_common_hparams(meta, rope_type=self.rope_type, norm_eps_key=self.norm_eps_key)
        load_encoder_hparams(meta, hp)
        return hp

    def create_memory(self, hp, n_ctx, backend, type_k, type_v, n_ubatch):
        return EncoderMemory(n_ctx)

    def kv_cells(self, hp, n_ctx, n_ubatch):
        return [0] * hp.n_layer

    def build_graph(self, b: GraphBuilder):
        w = b.w
        x = ops.add(b.token_embeddings(w.tok_embd), b.position_embeddings(w.pos_embd))   # [n_embd, n_tokens]
        if w.type_embd is not None:                    # every token is of type 0 ("sentence A"), as llama.cpp
            x = ops.add(x, ops.view(w.type_embd, (b.hp.n_embd,)))
        x = b.norm(x, w.tok_norm, w.tok_norm_b, Norm.LAYER)
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(x, layer)                                            # [hd, n_head, n_tokens]
            cur = b.linear(attend_within_ubatch(b, q, k, v), layer.wo, layer.bo)
            if il == b.hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = b.norm(ops.add(x, cur), layer.attn_out_norm, layer.attn_out_norm_b, Norm.LAYER)   # post-norm
            cur = b.ffn(x, up=layer.ffn_up, up_b=layer.ffn_up_b, down=layer.ffn_down, down_b=layer.ffn_down_b,
                        kind=FFN.GELU)
            x = b.norm(ops.add(x, cur), layer.layer_out_norm, layer.layer_out_norm_b, Norm.LAYER)
        return classification_head(b, x)


def load_encoder_hparams(meta: Metadata, hp: HParams) -> None:
    """The encoder's own keys, into hp.extra: token types, pooling, the classifier's outputs."""
    hp.extra["n_token_types"] = meta.get_int("tokenizer.ggml.token_type_count", 2, min=1)
    pooling = meta.get_int(meta.arch_key("pooling_type"), 0, min=0)
    if pooling >= len(POOLING):
        raise ModelLoadError(f"{meta.path}: {meta.arch_key('pooling_type')} = {pooling} is not one of "
                             f"0..{len(POOLING) - 1} ({', '.join(POOLING)})")
    hp.extra["pooling"] = POOLING[pooling]
    labels = meta.get_array(meta.arch_key("classifier.output_labels"), "str", None)
    hp.extra["n_cls_out"] = len(labels) if labels else 1
    hp.extra["encoder"] = True


def classification_head(b: GraphBuilder, x: Tensor) -> Tensor:
    """The hidden states x [n_embd, n_outputs] (embeddings), or with a classifier and logits asked for,
    its scores [n_cls_out, n_outputs]: cls_out(tanh(cls(x))) as ggml's rank pooling computes them."""
    w = b.w
    if b.embeddings or w.cls_out is None:
        return b.lm_head(x, x) if b.embeddings else x
    if w.cls is not None:
        x = ops.tanh(b.linear(x, w.cls, w.cls_b))
    return b.linear(x, w.cls_out, w.cls_out_b)


@hookimpl
def register_architectures(register):
    register(Bert())
