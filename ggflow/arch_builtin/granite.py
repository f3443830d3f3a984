"""granite: llama's block with four multipliers (IBM Granite 3.x).

The token embeddings are scaled by ``embedding_scale``, attention scores by ``attention.scale`` in place of
1/sqrt(head_dim), each block's attention and FFN outputs by ``residual_scale`` before their residual add,
and the logits divided by ``logit_scale`` (required, as llama.cpp requires it). A multiplier that is absent
or 0 is left out, as llama.cpp leaves it out.
"""
from __future__ import annotations

from ggflow.arch_builtin.llama import Llama, llama_ffn
from ggflow.core import ops
from ggflow.core.graph_builder import GraphBuilder, Norm
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.errors import ModelLoadError
from ggflow.plugins.hookspecs import hookimpl


class Granite(Llama):
    names = ("granite",)

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = super().load_hparams(meta)
        key = meta.arch_key
        logit_scale = meta.get_float(key("logit_scale"))
        if logit_scale == 0:
            raise ModelLoadError(f"{meta.path}: {key('logit_scale')} = 0 (the logits are divided by it)")
        hp.extra.update(logit_scale=logit_scale,
                        residual_scale=meta.get_float(key("residual_scale"), 0.0),
                        embedding_scale=meta.get_float(key("embedding_scale"), 0.0),
                        attention_scale=meta.get_float(key("attention.scale"), 0.0))
        return hp

    def build_graph(self, b: GraphBuilder):
        hp, w = b.hp, b.w
        scales = hp.extra
        residual = (lambda t: ops.scale(t, scales["residual_scale"])) if scales["residual_scale"] else (lambda t: t)
        x = b.token_embeddings(w.tok_embd, scales["embedding_scale"] or None)    # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            cur = b.norm(x, layer.attn_norm, None, Norm.RMS)
            q, k, v = b.qkv(cur, layer)                                           # [hd, n_head(_kv), n_tokens]
            q, k = b.rope(q, w.rope_freqs), b.rope(k, w.rope_freqs)
            cur = b.attention(il, q, k, v, kq_scale=scales["attention_scale"] or None)
            cur = b.linear(cur, layer.wo, layer.bo)                               # [n_embd, n_tokens]
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(residual(cur), x)                                         # residual
            cur = b.norm(x, layer.ffn_norm, None, Norm.RMS)
            cur = llama_ffn(b, cur, layer)
            x = ops.add(residual(cur), x)                                         # residual
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        logits = b.lm_head(x, w.output or w.tok_embd)                             # [n_vocab, n_outputs]
        return logits if b.embeddings else ops.scale(logits, 1.0 / scales["logit_scale"])


@hookimpl
def register_architectures(register):
    register(Granite())
