"""Shared transformer building blocks: an architecture's graph is a short composition of these.

One GraphBuilder is made per graph build (per ubatch shape). It makes the graph inputs of the batch
(token ids, positions, the ids of the tokens whose logits are wanted) and asks the memory for its own
(KV-cache cell indices and the mask), and gives blocks that take the architecture's weight tensors and
read top to bottom as the model's math: embed, norm, project, RoPE, attend over the memory,
feed-forward, output. Shapes in comments are ggml's ne, innermost first.
"""
from __future__ import annotations

import math
from enum import Enum
from typing import TYPE_CHECKING

from ggflow.core import ops
from ggflow.core.experts import Experts, Gating
from ggflow.core.graph import Graph
from ggflow.core.tensor import Tensor
from ggflow.plugins.removed import removed_names

if TYPE_CHECKING:
    from ggflow.core.lora_mix import LoraGraph
    from ggflow.core.memory import Memory
    from ggflow.core.model import Model


class Norm(Enum):
    RMS = "rms"        # x / rms(x) * w
    LAYER = "layer"    # (x - mean) / std * w + b


class FFN(Enum):
    SILU_GATED = "silu_gated"   # down(silu(gate(x)) * up(x)): llama, qwen (SwiGLU)
    GELU_GATED = "gelu_gated"   # down(gelu(gate(x)) * up(x)): GEGLU (gelu with the tanh approximation)
    GELU = "gelu"               # down(gelu(up(x))): gpt2
    SWIGLU_OAI = "swiglu_oai"   # experts only: down(g * sigmoid(1.702 g) * (clamp(up(x), -7, 7) + 1)),
                                # g = min(gate(x), 7) (gpt-oss; ggml_swiglu_oai)


SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0   # llama.cpp's constants for gpt-oss's experts


class GraphBuilder:
    def __init__(self, model: "Model", memory: "Memory", n_tokens: int, n_outputs: int, n_kv: int,
                 embeddings: bool = False, lora: "LoraGraph | None" = None):
        self.model, self.hp, self.memory = model, model.hparams, memory
        self.lora = lora   # LoRA adapters of this ubatch's sequences, added at each adapted product (lora_mix.py)
        self.n_tokens, self.n_outputs, self.n_kv = n_tokens, n_outputs, n_kv
        self.embeddings = embeddings   # output the final hidden state instead of logits (llama.cpp's t_embd)
        self.t_embd: Tensor | None = None
        self.graph = Graph()
        self.inp_tokens = ops.new_input("I32", (n_tokens,), "inp_tokens")
        self.inp_pos = ops.new_input("I32", (n_tokens,), "inp_pos")
        self.inp_memory = memory.build_inputs(n_tokens, n_kv)   # KV cell indices and the mask
        self.inp_out_ids = ops.new_input("I32", (n_outputs,), "inp_out_ids")

    # -- weights -------------------------------------------------------------------------------
    @property
    def w(self):
        """The model's weight record, as its architecture declared it: w.tok_embd, w.layers[il].wq, ..."""
        return self.model.w

    # -- blocks --------------------------------------------------------------------------------
    def token_embeddings(self, tok_embd: Tensor, scale: float | None = None) -> Tensor:
        """The rows of tok_embd for the ubatch's tokens, times scale when given (e.g. sqrt(n_embd))."""
        x = ops.get_rows(tok_embd, self.inp_tokens)                               # [n_embd, n_tokens]
        if self.lora is not None:
            x = self.lora.apply_rows(tok_embd, self.inp_tokens, x)
        return ops.scale(x, scale) if scale is not None else x

    def position_embeddings(self, pos_embd: Tensor) -> Tensor:
        return ops.get_rows(pos_embd, self.inp_pos)                               # [n_embd, n_tokens]

    def norm(self, x: Tensor, weight: Tensor, bias: Tensor | None, kind: Norm) -> Tensor:
        """Normalize each row of x, then scale by weight (and shift by bias, when there is one)."""
        if kind is Norm.RMS:
            x = ops.rms_norm(x, self.hp.norm_rms_eps)
        else:
            x = ops.norm(x, self.hp.norm_eps)
        x = ops.mul(x, weight)
        return ops.add(x, bias) if bias is not None else x

    def linear(self, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        """x @ w^T (+ b): w's rows are the output features."""
        y = self.mm(w, x)
        return ops.add(y, b) if b is not None else y

    def mm(self, w: Tensor, x: Tensor) -> Tensor:
        """w x, plus the LoRA adapters' low-rank products where w is adapted (llama.cpp's build_lora_mm)."""
        y = ops.mul_mat(w, x)
        return y if self.lora is None else self.lora.apply(w, x, y)

    def qkv(self, x: Tensor, layer) -> tuple[Tensor, Tensor, Tensor]:
        """Project x to heads of Q, K, V with the layer's wq/wk/wv and, where it has them, bq/bk/bv.

        -> q [head_dim, n_head, n_tokens], k and v [head_dim, n_head_kv, n_tokens] (as llama.cpp's build_qkv).
        """
        hp = self.hp
        products = [ops.mul_mat(w, x) for w in (layer.wq, layer.wk, layer.wv)]
        for product in products:
            # one after another in the graph, before what reads them (llama.cpp's build_attn expands q, k and
            # v together too): a backend may run products of one x as one call (the CPU's product groups)
            self.graph.expand(product)
        if self.lora is not None:
            products = [self.lora.apply(w, x, y) for w, y in zip((layer.wq, layer.wk, layer.wv), products)]
        q, k, v = (y if bias is None else ops.add(y, bias)
                   for y, bias in zip(products, (getattr(layer, name, None) for name in ("bq", "bk", "bv"))))
        return (self.split_heads(q, hp.n_embd_head_k), self.split_heads(k, hp.n_embd_head_k),
                self.split_heads(v, hp.n_embd_head_v))

    def split_qkv(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A fused projection [q | k | v, n_tokens] (one attn_qkv weight) as heads, like ``qkv``'s result:
        q [hd, n_head, n_tokens], k and v [hd, n_head_kv, n_tokens]; each a view of its rows, made whole."""
        hp = self.hp
        n_q, n_k = hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa
        return (self.split_heads(column_rows(qkv, 0, n_q), hp.n_embd_head_k),
                self.split_heads(column_rows(qkv, n_q, n_k), hp.n_embd_head_k),
                self.split_heads(column_rows(qkv, n_q + n_k, hp.n_embd_v_gqa), hp.n_embd_head_v))

    def rope(self, x: Tensor, freq_factors: Tensor | None = None, *, freq_base: float | None = None,
             freq_scale: float | None = None, attn_factor: float = 1.0) -> Tensor:
        """Rotate the first n_rot dims of each head of x [head_dim, n_head, n_tokens] by its position.

        freq_factors (Llama 3's rope_freqs) divide each rotated pair's frequency, when given. freq_base and
        freq_scale default to the model's; a layer with its own (a sliding-window layer, often) passes them.
        attn_factor multiplies the rotated values (cos and sin), as ggml_rope_ext's attn_factor.
        """
        hp = self.hp
        return ops.rope(x, self.inp_pos, hp.n_rot, hp.rope_type,
                        freq_base=hp.rope_freq_base if freq_base is None else freq_base,
                        freq_scale=hp.rope_freq_scale if freq_scale is None else freq_scale,
                        n_ctx_orig=hp.n_ctx_train, attn_factor=attn_factor, freq_factors=freq_factors)

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor, kq_scale: float | None = None,
                  softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
        """Write this ubatch's K/V into the memory, attend over its first n_kv cells.

        q [head_dim, n_head, n_tokens], k and v [head_dim, n_head_kv, n_tokens] -> [n_embd_v, n_tokens].
        softmax(kq * kq_scale + mask) with the mask the memory gives layer il (a sliding-window layer's is
        windowed); softcap: kq = softcap * tanh(kq / softcap) first (attention logit softcapping); sinks
        [n_head]: one more logit per head in each softmax's sum, whose value is dropped (gpt-oss).
        """
        mem, inp = self.memory, self.inp_memory
        # The writes are expanded first so every read below comes after them in the graph order.
        idxs = mem.kv_idxs(il, inp)                                              # this layer's cells
        self.graph.expand(mem.cpy_k(il, k, idxs))
        self.graph.expand(mem.cpy_v(il, v, idxs))
        keys, values = mem.get_k(il, self.n_kv), mem.get_v(il, self.n_kv)    # [hd, n_head_kv, n_kv]
        q = ops.permute(q, 0, 2, 1, 3)                                           # [hd, n_tokens, n_head]
        keys = ops.permute(keys, 0, 2, 1, 3)                                     # [hd, n_kv, n_head_kv]
        kq = ops.mul_mat(keys, q)                                                # [n_kv, n_tokens, n_head]
        if softcap is not None:
            kq = self.softcap(kq, softcap)
        scale = kq_scale if kq_scale is not None else 1.0 / math.sqrt(self.hp.n_embd_head_k)
        if sinks is None:
            kq = ops.soft_max(kq, mem.kq_mask(il, inp), scale)
        else:
            kq = ops.soft_max_sinks(kq, mem.kq_mask(il, inp), scale, sinks)
        values = ops.permute(values, 1, 2, 0, 3)                                 # [n_kv, hd_v, n_head_kv]
        kqv = ops.mul_mat(values, kq)                                            # [hd_v, n_tokens, n_head]
        out = ops.cont(ops.permute(kqv, 0, 2, 1, 3))                             # [hd_v, n_head, n_tokens]
        return ops.reshape(out, self.hp.n_embd_head_v * self.hp.n_head, self.n_tokens)

    def ffn(self, x: Tensor, *, up: Tensor, down: Tensor, gate: Tensor | None = None, kind: FFN,
            up_b: Tensor | None = None, gate_b: Tensor | None = None, down_b: Tensor | None = None) -> Tensor:
        """The feed-forward block: down(act(up(x))), or down(act(gate(x)) * up(x)) when gated."""
        if kind in (FFN.SILU_GATED, FFN.GELU_GATED):
            act = ops.silu if kind is FFN.SILU_GATED else ops.gelu
            # up first: the graph then runs gate, act and mul one after another, a chain a backend can
            # fuse (the CPU's fusion.py); a product of two floats is the same bits in either order
            up_x = self.linear(x, up, up_b)
            h = ops.mul(up_x, act(self.linear(x, gate, gate_b)))
        else:
            h = ops.gelu(self.linear(x, up, up_b))
        return self.linear(h, down, down_b)

    def moe_ffn(self, x: Tensor, experts: Experts, *, gate_inp: Tensor, up_exps: Tensor, down_exps: Tensor,
                gate_exps: Tensor | None = None, kind: FFN = FFN.SILU_GATED,
                gate_inp_b: Tensor | None = None, exp_probs_b: Tensor | None = None,
                up_exps_b: Tensor | None = None, gate_exps_b: Tensor | None = None,
                down_exps_b: Tensor | None = None) -> Tensor:
        """A mixture of experts in place of the FFN (llama.cpp's build_moe_ffn): each token's router picks
        experts.n_expert_used of the n_expert FFNs (``moe_route``), runs its rows through them only, and sums
        their outputs weighted by the router's probabilities.

        x [n_embd, n]; up_exps / gate_exps [n_embd, n_ff_exp, n_expert], down_exps [n_ff_exp, n_embd,
        n_expert]; up_exps_b / gate_exps_b [n_ff_exp, n_expert], down_exps_b [n_embd, n_expert]: each expert's
        biases (ops.add_id); kind: SILU_GATED, GELU_GATED, SWIGLU_OAI, or without gate_exps act(up(x)).
        -> [n_embd, n].
        """
        n_embd, n = x.ne[0], x.ne[1]                     # n: n_tokens, or n_outputs after select_outputs
        chosen, weights = self.moe_route(x, experts, gate_inp, gate_inp_b, exp_probs_b)   # [k, n], [1, k, n]

        def experts_product(w: Tensor, b: Tensor | None, h: Tensor) -> Tensor:
            y = ops.mul_mat_id(w, h, chosen)
            if self.lora is not None:
                y = self.lora.apply_id(w, h, chosen, y)
            return y if b is None else ops.add_id(y, b, chosen)

        cur = ops.reshape(x, n_embd, 1, n)                                            # one row for every slot
        up = experts_product(up_exps, up_exps_b, cur)                                 # [n_ff_exp, k, n]
        if gate_exps is not None:
            gate = experts_product(gate_exps, gate_exps_b, cur)
            if kind is FFN.SWIGLU_OAI:
                gate = ops.clamp(gate, -math.inf, SWIGLU_OAI_LIMIT)
                glu = ops.mul(gate, ops.sigmoid(ops.scale(gate, SWIGLU_OAI_ALPHA)))
                h = ops.mul(glu, ops.scale(ops.clamp(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT), 1.0, 1.0))
            else:
                h = ops.mul((ops.silu if kind is FFN.SILU_GATED else ops.gelu)(gate), up)
        else:
            h = ops.gelu(up) if kind is FFN.GELU else ops.silu(up)
        out = ops.mul(experts_product(down_exps, down_exps_b, h), weights)           # [n_embd, k, n]
        self.graph.expand(out)
        slots = [ops.view(out, (n_embd, n), (out.nb[0], out.nb[2]), i * out.nb[1]) for i in range(weights.ne[1])]
        total = slots[0]
        for slot in slots[1:]:                                                        # the weighted sum
            total = ops.add(total, slot)
        return ops.cont(total) if len(slots) == 1 else total

    def moe_route(self, x: Tensor, experts: Experts, gate_inp: Tensor, gate_inp_b: Tensor | None = None,
                  exp_probs_b: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Each token's experts and their weights: -> (I32 [k, n], F32 [1, k, n]), k = experts.n_expert_used.

        The router's logits gate_inp @ x (+ gate_inp_b); probabilities by experts.gating (softmax, sigmoid, or
        for SOFTMAX_WEIGHT the logits, softmaxed over the chosen k); the top k by argsort, on the probabilities
        plus exp_probs_b where given (the bias chooses, it does not weigh); the weights divided by their sum
        where experts.norm_weights (the sum kept >= F16's least normal, as llama.cpp), then times
        experts.weights_scale where it is neither 0 nor 1.
        """
        n_expert, k, n = experts.n_expert, experts.n_expert_used, x.ne[1]
        logits = self.linear(x, gate_inp, gate_inp_b)                                # [n_expert, n]
        if experts.gating is Gating.SOFTMAX:
            probs = ops.soft_max(logits)
        elif experts.gating is Gating.SIGMOID:
            probs = ops.sigmoid(logits)
        else:
            probs = logits
        chosen = ops.argsort_top_k(probs if exp_probs_b is None else ops.add(probs, exp_probs_b), k)  # [k, n]
        weights = ops.get_rows(ops.reshape(probs, 1, n_expert, n), chosen)           # [1, k, n]
        if experts.gating is Gating.SOFTMAX_WEIGHT:
            weights = ops.reshape(ops.soft_max(ops.reshape(weights, k, n)), 1, k, n)
        if experts.norm_weights:
            weights = ops.reshape(weights, k, n)
            total = ops.clamp(ops.sum_rows(weights), 6.103515625e-5, math.inf)
            weights = ops.reshape(ops.div(weights, total), 1, k, n)
        if experts.weights_scale not in (0.0, 1.0):
            weights = ops.scale(weights, experts.weights_scale)
        self.graph.expand(weights)
        return chosen, weights

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """cap * tanh(x / cap): squash values into (-cap, cap) (attention and final-logit softcapping)."""
        return ops.scale(ops.tanh(ops.scale(x, 1.0 / cap)), cap)

    def select_outputs(self, *xs: Tensor) -> tuple[Tensor, ...]:
        """Keep only the tokens whose logits are wanted (done before the last FFN, as llama.cpp does)."""
        if self.n_outputs == self.n_tokens:
            return xs
        return tuple(ops.get_rows(x, self.inp_out_ids) for x in xs)

    def lm_head(self, x: Tensor, output: Tensor) -> Tensor:
        """Logits [n_vocab, n_outputs] (output is the token embedding, for a model that ties them).
        With ``embeddings``, x itself [n_embd, n_outputs]: the hidden state after the output norm, kept as
        ``t_embd`` (what an architecture does to the logits afterwards, e.g. a softcap, is left out)."""
        if self.embeddings:
            self.t_embd = x
            return x
        return self.mm(output, x)

    def split_heads(self, x: Tensor, head_dim: int) -> Tensor:
        """[head_dim * n, n_tokens] -> [head_dim, n, n_tokens]."""
        return ops.reshape(x if x.is_contiguous() else ops.cont(x), head_dim, x.ne[0] // head_dim, self.n_tokens)

    def output(self, result: Tensor) -> Tensor:
        """What the graph outputs for an architecture's result: the logits, or with ``embeddings`` t_embd."""
        return self.t_embd if self.embeddings and self.t_embd is not None else result

    def finish(self, logits: Tensor) -> Graph:
        logits.name = "result_norm" if logits is self.t_embd else "result_output"
        self.graph.mark_output(logits)
        return self.graph


def column_rows(x: Tensor, start: int, n: int) -> Tensor:
    """Elements [start, start + n) of each column of x [m, n_tokens]: a view (a fused projection's part)."""
    return ops.view(x, (n, x.ne[1]), (x.nb[0], x.nb[1]), start * x.nb[0])

__getattr__ = removed_names(__name__)   # a removed name says what replaced it
