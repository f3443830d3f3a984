"""qwen2 and qwen3: llama's block with NEOX-mode RoPE; qwen2 has Q/K/V biases, qwen3 per-head Q/K RMSNorm."""
from __future__ import annotations

from ggflow.core import ops
from ggflow.core.arch import TensorShapes
from ggflow.core.graph_builder import GraphBuilder, Norm
from ggflow.core.model import HParams
from ggflow.arch_builtin.llama import Llama
from ggflow.plugins.hookspecs import hookimpl


class Qwen2(Llama):
    names = ("qwen2",)
    rope_type = ops.ROPE_NEOX

    def tensor_shapes(self, hp: HParams) -> TensorShapes:
        shapes = super().tensor_shapes(hp)
        for il in range(hp.n_layer):
            p = f"blk.{il}"
            shapes[f"{p}.attn_q.bias"] = ((hp.n_embd_head_k * hp.n_head,), True)
            shapes[f"{p}.attn_k.bias"] = ((hp.n_embd_k_gqa,), True)
            shapes[f"{p}.attn_v.bias"] = ((hp.n_embd_v_gqa,), True)
        return shapes


class Qwen3(Llama):
    names = ("qwen3",)
    rope_type = ops.ROPE_NEOX

    def tensor_shapes(self, hp: HParams) -> TensorShapes:
        shapes = super().tensor_shapes(hp)
        for il in range(hp.n_layer):
            shapes[f"blk.{il}.attn_q_norm.weight"] = ((hp.n_embd_head_k,), True)
            shapes[f"blk.{il}.attn_k_norm.weight"] = ((hp.n_embd_head_k,), True)
        return shapes

    def qk_norm(self, b: GraphBuilder, il: int, q, k):
        return b.norm(q, f"blk.{il}.attn_q_norm", Norm.RMS), b.norm(k, f"blk.{il}.attn_k_norm", Norm.RMS)


@hookimpl
def register_architectures(register):
    register(Qwen2())
    register(Qwen3())
