"""gemma3: Gemma 3's text decoder, as llama.cpp's src/models/gemma3.cpp builds it.

Per layer: RMSNorm -> Q/K/V -> per-head RMSNorm of Q and K -> NEOX RoPE (local layers: base
rope.freq_base_swa, default 10000; global layers: rope.freq_base) -> Q scaled by 1/sqrt(head_dim) ->
attention (local layers see only the last ``sliding_window`` positions; of every ``sliding_window_pattern``
layers, default 6, all but the last are local) -> output projection -> post-attention RMSNorm -> residual
-> RMSNorm -> GEGLU FFN -> post-FFN RMSNorm -> residual. The embedding is scaled by sqrt(n_embd); the
output is tied to it; final-logit softcapping applies when the file sets it. GGUF stores the norm weights
with Gemma's "1 +" already added, so they are plain RMSNorm weights here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ggflow.core import ops
from ggflow.core.arch import Architecture
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.memory import SlidingWindow
from ggflow.core.hparams import HParams
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.core.weights import optional, per_layer, tensor
from ggflow.errors import ModelLoadError

SWA_PATTERN = 6                 # llama.cpp's default for gemma3: 5 local layers, then 1 global
ROPE_FREQ_BASE_SWA = 10000.0    # llama.cpp's default rope_freq_base_train_swa


@dataclass(kw_only=True)
class Gemma3Layer:
    attn_norm: Tensor = tensor("blk.{il}.attn_norm.weight", lambda hp: (hp.n_embd,))
    wq: Tensor = tensor("blk.{il}.attn_q.weight", lambda hp: (hp.n_embd, hp.n_embd_head_k * hp.n_head))
    wk: Tensor = tensor("blk.{il}.attn_k.weight", lambda hp: (hp.n_embd, hp.n_embd_k_gqa))
    wv: Tensor = tensor("blk.{il}.attn_v.weight", lambda hp: (hp.n_embd, hp.n_embd_v_gqa))
    attn_q_norm: Tensor = tensor("blk.{il}.attn_q_norm.weight", lambda hp: (hp.n_embd_head_k,))
    attn_k_norm: Tensor = tensor("blk.{il}.attn_k_norm.weight", lambda hp: (hp.n_embd_head_k,))
    wo: Tensor = tensor("blk.{il}.attn_output.weight", lambda hp: (hp.n_embd_head_k * hp.n_head, hp.n_embd))
    attn_post_norm: Tensor = tensor("blk.{il}.post_attention_norm.weight", lambda hp: (hp.n_embd,))
    ffn_norm: Tensor = tensor("blk.{il}.ffn_norm.weight", lambda hp: (hp.n_embd,))
    ffn_gate: Tensor = tensor("blk.{il}.ffn_gate.weight", lambda hp: (hp.n_embd, hp.n_ff))
    ffn_up: Tensor = tensor("blk.{il}.ffn_up.weight", lambda hp: (hp.n_embd, hp.n_ff))
    ffn_down: Tensor = tensor("blk.{il}.ffn_down.weight", lambda hp: (hp.n_ff, hp.n_embd))
    ffn_post_norm: Tensor = tensor("blk.{il}.post_ffw_norm.weight", lambda hp: (hp.n_embd,))


@dataclass(kw_only=True)
class Gemma3Weights:
    tok_embd: Tensor = tensor("token_embd.weight", lambda hp: (hp.n_embd, hp.n_vocab))
    layers: list[Gemma3Layer] = per_layer(Gemma3Layer)
    output_norm: Tensor = tensor("output_norm.weight", lambda hp: (hp.n_embd,))
    output: Tensor | None = optional("output.weight", lambda hp: (hp.n_embd, hp.n_vocab))


class Gemma3(Architecture):
    names = ("gemma3",)
    weights = Gemma3Weights
    rope_type = ops.ROPE_NEOX

    def load_hparams(self, meta: Metadata) -> HParams:
        hp = super().load_hparams(meta)
        n_swa = int(meta.arch_get("attention.sliding_window", 0) or 0)
        hp.extra["swa"] = self._sliding_window(meta, hp, n_swa) if n_swa > 0 else None
        hp.extra["rope_freq_base_swa"] = float(meta.arch_get("rope.freq_base_swa", ROPE_FREQ_BASE_SWA))
        hp.extra["final_logit_softcapping"] = float(meta.arch_get("final_logit_softcapping", 0.0) or 0.0)
        # gemma_pytorch's query_pre_attn_scalar: n_embd / n_head for the 27B (62 layers), else head_dim
        scalar = hp.n_embd // hp.n_head if hp.n_layer == 62 else hp.n_embd_head_k
        hp.extra["attention_scale"] = 1.0 / math.sqrt(scalar)
        return hp

    @staticmethod
    def _sliding_window(meta: Metadata, hp: HParams, n_swa: int) -> SlidingWindow:
        pattern = meta.arch_get("attention.sliding_window_pattern", SWA_PATTERN)
        if hasattr(pattern, "__len__"):   # an array: one flag per layer (true: local)
            flags = [bool(f) for f in pattern]
            if len(flags) != hp.n_layer:
                raise ModelLoadError(f"{meta.path}: sliding_window_pattern has {len(flags)} flags for "
                                     f"{hp.n_layer} layers")
            return SlidingWindow(n_swa, frozenset(il for il, f in enumerate(flags) if f))
        return SlidingWindow.every(n_swa, hp.n_layer, int(pattern))

    @staticmethod
    def layer_rope(hp: HParams, il: int) -> tuple[float, float]:
        """(freq_base, freq_scale) of layer il's RoPE: local layers have their own, unscaled (llama.cpp's
        rope_freq_base_train_swa, rope_freq_scale_train_swa)."""
        swa = hp.extra["swa"]
        if swa is not None and il in swa.layers:
            return hp.extra["rope_freq_base_swa"], 1.0
        return hp.rope_freq_base, hp.rope_freq_scale

    def create_memory(self, hp, n_ctx, backend, type_k, type_v, n_ubatch):
        """The local layers keep a window-sized cache (llama.cpp's iswa cache); no window: the unified one."""
        from ggflow.core.kv_cache import KVCache
        from ggflow.core.kv_cache_iswa import IswaCache
        layer_rope = [self.layer_rope(hp, il) for il in range(hp.n_layer)]
        if hp.extra["swa"] is None or not hp.extra["swa"].layers:
            return KVCache(hp, n_ctx, backend, type_k, type_v, layer_rope=layer_rope)
        return IswaCache(hp, n_ctx, backend, type_k, type_v, hp.extra["swa"], n_ubatch, layer_rope=layer_rope)

    def kv_cells(self, hp, n_ctx, n_ubatch):
        """The cells create_memory's caches keep: n_ctx for the global layers, the window cache's for the local ones."""
        from ggflow.core.kv_cache_iswa import window_cache_size
        swa = hp.extra["swa"]
        if swa is None or not swa.layers:
            return [n_ctx] * hp.n_layer
        local = window_cache_size(n_ctx, swa.n_swa, n_ubatch)
        return [local if il in swa.layers else n_ctx for il in range(hp.n_layer)]

    def build_graph(self, b: GraphBuilder):
        hp, w = b.hp, b.w
        x = b.token_embeddings(w.tok_embd, scale=math.sqrt(hp.n_embd))           # [n_embd, n_tokens]
        for il, layer in enumerate(w.layers):
            freq_base, freq_scale = self.layer_rope(hp, il)
            rope = dict(freq_base=freq_base, freq_scale=freq_scale)
            q, k, v = b.qkv(b.norm(x, layer.attn_norm, None, Norm.RMS), layer)    # [hd, n_head(_kv), n_tokens]
            q = b.rope(b.norm(q, layer.attn_q_norm, None, Norm.RMS), **rope)      # per-head norm, then RoPE
            k = b.rope(b.norm(k, layer.attn_k_norm, None, Norm.RMS), **rope)
            q = ops.scale(q, hp.extra["attention_scale"])
            cur = b.linear(b.attention(il, q, k, v, kq_scale=1.0), layer.wo)      # [n_embd, n_tokens]
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(b.norm(cur, layer.attn_post_norm, None, Norm.RMS), x)    # post-norm, residual
            cur = b.ffn(b.norm(x, layer.ffn_norm, None, Norm.RMS), up=layer.ffn_up, gate=layer.ffn_gate,
                        down=layer.ffn_down, kind=FFN.GELU_GATED)
            x = ops.add(b.norm(cur, layer.ffn_post_norm, None, Norm.RMS), x)     # post-norm, residual
        x = b.norm(x, w.output_norm, None, Norm.RMS)
        logits = b.lm_head(x, w.output or w.tok_embd)                             # [n_vocab, n_outputs]
        cap = hp.extra["final_logit_softcapping"]
        return b.softcap(logits, cap) if cap else logits
