"""gpt2: LayerNorm with bias, learned position embeddings, fused QKV projection, GELU FFN, no RoPE."""
from __future__ import annotations

from ggflow.core import ops
from ggflow.core.arch import Architecture, TensorShapes, load_common_hparams
from ggflow.core.graph_builder import FFN, GraphBuilder, Norm
from ggflow.core.model import HParams, Metadata
from ggflow.plugins.hookspecs import hookimpl


class GPT2(Architecture):
    names = ("gpt2",)

    def load_hparams(self, meta: Metadata) -> HParams:
        return load_common_hparams(meta)

    def tensor_shapes(self, hp: HParams) -> TensorShapes:
        e, f = hp.n_embd, hp.n_ff
        shapes: TensorShapes = {
            "token_embd.weight": ((e, hp.n_vocab), True),
            "position_embd.weight": ((e, hp.n_ctx_train), True),
            "output_norm.weight": ((e,), True),
            "output_norm.bias": ((e,), True),
            "output.weight": ((e, hp.n_vocab), False),
        }
        for il in range(hp.n_layer):
            p = f"blk.{il}"
            shapes.update({
                f"{p}.attn_norm.weight": ((e,), True), f"{p}.attn_norm.bias": ((e,), True),
                f"{p}.attn_qkv.weight": ((e, 3 * e), True), f"{p}.attn_qkv.bias": ((3 * e,), True),
                f"{p}.attn_output.weight": ((e, e), True), f"{p}.attn_output.bias": ((e,), True),
                f"{p}.ffn_norm.weight": ((e,), True), f"{p}.ffn_norm.bias": ((e,), True),
                f"{p}.ffn_up.weight": ((e, f), True), f"{p}.ffn_up.bias": ((f,), True),
                f"{p}.ffn_down.weight": ((f, e), True), f"{p}.ffn_down.bias": ((e,), True),
            })
        return shapes

    def build_graph(self, b: GraphBuilder):
        hp = b.hp
        e, hd = hp.n_embd, hp.n_embd_head_k
        x = ops.add(b.token_embeddings(), b.position_embeddings())               # [n_embd, n_tokens]
        for il in range(hp.n_layer):
            p = f"blk.{il}"
            qkv = b.linear(b.norm(x, f"{p}.attn_norm", Norm.LAYER), f"{p}.attn_qkv")  # [3 n_embd, n_tokens]
            q, k, v = (ops.view(qkv, (e, b.n_tokens), (qkv.nb[0], qkv.nb[1]), offset=i * e * qkv.nb[0])
                       for i in range(3))
            q, k, v = (b.split_heads(t, hd) for t in (q, k, v))                    # [hd, n_head, n_tokens]
            cur = b.linear(b.attention(il, q, k, v), f"{p}.attn_output")
            if il == hp.n_layer - 1:
                cur, x = b.select_outputs(cur, x)
            x = ops.add(x, cur)
            x = ops.add(x, b.ffn(b.norm(x, f"{p}.ffn_norm", Norm.LAYER), il, FFN.GELU))
        x = b.norm(x, "output_norm", Norm.LAYER)
        return b.lm_head(x)


@hookimpl
def register_architectures(register):
    register(GPT2())
