"""gpt-oss (llama.cpp's openai-moe): alternating sliding-window and full attention with attention sinks,
YaRN RoPE, and a mixture of experts with biases (gpt-oss-20b: 32 experts, 4 used; 120b: 128, 4).

Per layer: RMSNorm, Q/K/V with biases, NEOX RoPE stretched by YaRN, attention whose softmax also counts a
learned sink logit per head, output projection with bias, residual; RMSNorm (attn_post_norm), a router with
bias choosing the top experts by raw logit and softmaxing over them (Gating.SOFTMAX_WEIGHT), each expert's
clamped SwiGLU with biases (FFN.SWIGLU_OAI), weighted sum, residual. Layers 0, 2, 4, ... attend over the last
``attention.sliding_window`` positions only (llama.cpp's swa pattern 2). The experts are usually MXFP4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.experts import Gating, experts_of, load_experts, n_expert, n_ff_exp
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.memory import SlidingWindow
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.core.weights import per_layer, tensor
from ggflow.errors import ModelLoadError
from ggflow.plugins.hookspecs import hookimpl

SWA_PATTERN = 2     # of each 2 layers, the first is local


@dataclass(kw_only=True)
class GptOssLayer:
    attn_norm: Tensor = tensor("blk.{il}.attn_norm.weight", lambda hp: (hp.n_embd,))
    wq: Tensor = tensor("blk.{il}.attn_q.weight", lambda hp: (hp.n_embd, hp.n_embd_head_k * hp.n_head))
    wk: Tensor = tensor("blk.{il}.attn_k.weight", lambda hp: (hp.n_embd, hp.n_embd_k_gqa))
    wv: Tensor = tensor("blk.{il}.attn_v.weight", lambda hp: (hp.n_embd, hp.n_embd_v_gqa))
    bq: Tensor = tensor("blk.{il}.attn_q.bias", lambda hp: (hp.n_embd_head_k * hp.n_head,))
    bk: Tensor = tensor("blk.{il}.attn_k.bias", lambda hp: (hp.n_embd_k_gqa,))
    bv: Tensor = tensor("blk.{il}.attn_v.bias", lambda hp: (hp.n_embd_v_gqa,))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd_head_v * hp.n_head, hp.n_embd))
    bo: Tensor = tensor("blk.{il}.attn_output.bias", lambda hp: (hp.n_embd,))
    attn_sinks: Tensor = tensor("blk.{il}.attn_sinks.weight", lambda hp: (hp.n_head,))
    attn_post_norm: Tensor = tensor("blk.{il}.post_attention_norm.weight", lambda hp: (hp.n_embd,))
    ffn_gate_inp: Tensor = tensor("blk.{il}.ffn_gate_inp.weight", lambda hp: (hp.n_embd, n_expert(hp)))
    ffn_gate_inp_b: Tensor = tensor("blk.{il}.ffn_gate_inp.bias", lambda hp: (n_expert(hp),))
    ffn_gate_exps: Tensor = tensor("blk.{il}.ffn_gate_exps.weight", lambda hp: (hp.n_embd, n_ff_exp(hp), n_expert(hp)))
    ffn_up_exps: Tensor = tensor("blk.{il}.ffn_up_exps.weight", lambda hp: (hp.n_embd, n_ff_exp(hp), n_expert(hp)))
    ffn_down_exps: Tensor = tensor("blk.{il}.ffn_down_exps.weight", lambda hp: (n_ff_exp(hp), hp.n_embd, n_expert(hp)))
    ffn_gate_exps_b: Tensor = tensor("blk.{il}.ffn_gate_exps.bias", lambda hp: (n_ff_exp(hp), n_expert(hp)))
    ffn_up_exps_b: Tensor = tensor("blk.{il}.ffn_up_exps.bias", lambda hp: (n_ff_exp(hp), n_expert(hp)))
    ffn_down_exps_b: Tensor = tensor("blk.{il}.ffn_down_exps.bias", lambda hp: (hp.n_embd, n_expert(hp)))


@dataclass(kw_only=True)
class GptOssWeights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    layers: list[GptOssLayer] = per_layer(GptOssLayer)
    output_norm: Tensor = tensor("output_norm.weight", lambda hp: (hp.n_embd,))
    output: Tensor = tensor("output.weight", lambda hp: (hp.n_embd, hp.n_vocab))


class GptOss(Architecture):
    names = ("gpt-oss",)
    weights = GptOssWeights
    rope_type = ops.ROPE_NEOX

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = super().load_hparams(meta)
        key = meta.arch_key
        hp.extra["experts"] = load_experts(meta, hp.n_ff, required=True, gating=Gating.SOFTMAX_WEIGHT)
        hp.extra["swa"] = SlidingWindow.every(meta.get_int(key("attention.sliding_window"), min=1, max=2**31 - 1),
                                              hp.n_layer, SWA_PATTERN)
        hp.extra["yarn"] = _yarn(meta, hp)
        return hp

    def create_memory(self, hp, n_ctx, backend, type_k, type_v, n_ubatch):
        """Full layers keep n_ctx cells, the local ones a window-sized cache (llama.cpp's iswa cache)."""
        from ggflow.core.kv_cache_iswa import IswaCache
        return IswaCache(hp, n_ctx, backend, type_k, type_v, hp.extra["swa"], n_ubatch)

    def kv_cells(self, hp, n_ctx, n_ubatch):
        from ggflow.core.kv_cache_iswa import window_cache_size
        swa = hp.extra["swa"]
        local = window_cache_size(n_ctx, swa.n_swa, n_ubatch)
        return [local if il in swa.layers else n_ctx for il in range(hp.n_layer)]

    def build_graph(self, b: GraphBuilder):
        hp, w = b.hp, b.w
        x = b.token_embeddings(w.tok_embd)                                        # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(b.norm(x, layer.attn_norm, None, Norm.RMS), layer)    # [hd, n_head(_kv), n_tokens]
            q, k = _rope(b, q), _rope(b, k)
            cur = b.attention(il, q, k, v, kq_scale=1.0 / math.sqrt(hp.n_rot), sinks=layer.attn_sinks)
            cur = b.linear(cur, layer.wo, layer.bo)                               # [n_embd, n_tokens]
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(cur, x)                                                   # residual
            cur = b.moe_ffn(b.norm(x, layer.attn_post_norm, None, Norm.RMS), experts_of(hp), kind=FFN.SWIGLU_OAI,
                            gate_inp=layer.ffn_gate_inp, gate_inp_b=layer.ffn_gate_inp_b,
                            up_exps=layer.ffn_up_exps, up_exps_b=layer.ffn_up_exps_b,
                            gate_exps=layer.ffn_gate_exps, gate_exps_b=layer.ffn_gate_exps_b,
                            down_exps=layer.ffn_down_exps, down_exps_b=layer.ffn_down_exps_b)
            x = ops.add(cur, x)                                                   # residual
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        return b.lm_head(x, w.output)                                             # [n_vocab, n_outputs]


def _rope(b: GraphBuilder, x: Tensor) -> Tensor:
    """NEOX RoPE with the file's YaRN stretch (freq_scale 1/factor, ext_factor 1), as llama.cpp's cparams."""
    hp, yarn = b.hp, b.hp.extra["yarn"]
    return ops.rope(x, b.inp_pos, hp.n_rot, hp.rope_type, freq_base=hp.rope_freq_base, **yarn)


def _yarn(meta: Metadata, hp: HParams) -> dict:
    """ggml_rope_ext's YaRN arguments from the rope.scaling keys, as llama_context computes them: ext_factor 1
    and attn_factor get_mscale(factor) / (1 + 0.1 ln factor) (ggml's rope multiplies the latter back in)."""
    import numpy as np
    key = meta.arch_key
    kind = meta.get_str(key("rope.scaling.type"), "none")
    if kind not in ("yarn", "none"):
        raise ModelLoadError(f"{meta.path}: {key('rope.scaling.type')} = {kind!r}; gpt-oss runs 'yarn' or 'none'")
    n_ctx_orig = meta.get_int(key("rope.scaling.original_context_length"), hp.n_ctx_train, min=1, max=2**31 - 1)
    if kind == "none":
        return dict(n_ctx_orig=n_ctx_orig)
    factor = np.float32(meta.get_float(key("rope.scaling.factor"), min=1.0))
    log_factor = np.float32(np.log(factor))
    mscale = np.float32(0.1) * log_factor + np.float32(1.0) if factor > 1 else np.float32(1.0)
    attn_factor = mscale * (np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * log_factor))
    return dict(freq_scale=float(np.float32(1.0) / factor), ext_factor=1.0, attn_factor=float(attn_factor),
                n_ctx_orig=n_ctx_orig,
                beta_fast=meta.get_float(key("rope.scaling.yarn_beta_fast"), 32.0),
                beta_slow=meta.get_float(key("rope.scaling.yarn_beta_slow"), 1.0))


@hookimpl
def register_architectures(register):
    register(GptOss())
