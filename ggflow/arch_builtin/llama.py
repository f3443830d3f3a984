"""llama: RMSNorm, RoPE (ggml's normal mode, as GGUF stores Q/K), grouped-query attention, SwiGLU FFN.

Covers Llama 2/3, SmolLM, Mistral-style files: optional Q/K/V/O biases, optional rope_freqs (Llama 3
scaling), output tied to the token embedding when the file has no output.weight.
"""
from __future__ import annotations

from ggflow.core import ops
from ggflow.core.arch import Architecture, TensorShapes, load_common_hparams
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.model import HParams, Metadata
from ggflow.plugins.hookspecs import hookimpl


class Llama(Architecture):
    names = ("llama",)
    rope_type = ops.ROPE_NORMAL

    def load_hparams(self, meta: Metadata) -> HParams:
        return load_common_hparams(meta, rope_type=self.rope_type)

    def tensor_shapes(self, hp: HParams) -> TensorShapes:
        shapes: TensorShapes = {
            "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
            "output_norm.weight": ((hp.n_embd,), True),
            "output.weight": ((hp.n_embd, hp.n_vocab), False),
        }
        for il in range(hp.n_layer):
            p = f"blk.{il}"
            shapes.update({
                f"{p}.attn_norm.weight": ((hp.n_embd,), True),
                f"{p}.attn_q.weight": ((hp.n_embd, hp.n_embd_head_k * hp.n_head), True),
                f"{p}.attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
                f"{p}.attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
                f"{p}.attn_output.weight": ((hp.n_embd_head_v * hp.n_head, hp.n_embd), True),
                f"{p}.ffn_norm.weight": ((hp.n_embd,), True),
                f"{p}.ffn_gate.weight": ((hp.n_embd, hp.n_ff), True),
                f"{p}.ffn_up.weight": ((hp.n_embd, hp.n_ff), True),
                f"{p}.ffn_down.weight": ((hp.n_ff, hp.n_embd), True),
            })
        return shapes

    def qk_norm(self, b: GraphBuilder, il: int, q, k):
        """Per-head Q/K normalization before RoPE (qwen3); none for llama."""
        return q, k

    def build_graph(self, b: GraphBuilder):
        hp = b.hp
        x = b.token_embeddings()                                                  # [n_embd, n_tokens]
        for il in range(hp.n_layer):
            p = f"blk.{il}"
            cur = b.norm(x, f"{p}.attn_norm", Norm.RMS)
            q = b.split_heads(b.linear(cur, f"{p}.attn_q"), hp.n_embd_head_k)     # [hd, n_head, n_tokens]
            k = b.split_heads(b.linear(cur, f"{p}.attn_k"), hp.n_embd_head_k)     # [hd, n_head_kv, n_tokens]
            v = b.split_heads(b.linear(cur, f"{p}.attn_v"), hp.n_embd_head_v)
            q, k = self.qk_norm(b, il, q, k)
            q, k = b.rope(q), b.rope(k)
            cur = b.linear(b.attention(il, q, k, v), f"{p}.attn_output")
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(x, cur)                                                   # residual
            cur = b.ffn(b.norm(x, f"{p}.ffn_norm", Norm.RMS), il, FFN.SILU_GATED)
            x = ops.add(x, cur)                                                   # residual
        x = b.norm(x, "output_norm", Norm.RMS)
        return b.lm_head(x)                                                       # [n_vocab, n_outputs]


@hookimpl
def register_architectures(register):
    register(Llama())
