"""Causal LMs to GGUF: llama (Llama, Mistral), qwen2, qwen3, and gpt2, with llama.cpp's converter's keys
and names. Each needs a byte-level BPE tokenizer.json (a SentencePiece tokenizer.model is refused).

llama stores Q and K with each head's rotated pairs interleaved (GGUF's "normal" RoPE order), so their
rows are permuted from Hugging Face's half-split order, as llama.cpp's converter does; qwen uses NeoX
RoPE and keeps them. gpt2's Conv1D weights are [in, out] and are transposed to [out, in].
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ggflow.convert.archs.base import ArchConverter, hparam, map_by_suffix
from ggflow.convert.source import HFModel
from ggflow.convert.vocab import add_bpe_vocab
from ggflow.convert.writer import ConvertError, TensorPlan

LLAMA_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
LLAMA_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def interleave_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of each head from Hugging Face's [first halves | second halves] to pairs (x0, x_half, x1, ...)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _reject_sentencepiece(model: HFModel) -> None:
    if model.file("tokenizer.json") is None and model.file("tokenizer.model") is not None:
        raise ConvertError(f"{model.path}: only a tokenizer.json (byte-level BPE) vocabulary is converted; "
                           f"this model has a SentencePiece tokenizer.model only")


class LlamaConverter(ArchConverter):
    hf_architectures = ("LlamaForCausalLM", "MistralForCausalLM")
    gguf_arch = "llama"
    permute_qk = True

    def set_metadata(self, writer: Any, model: HFModel) -> None:
        _reject_sentencepiece(model)
        n_embd, n_head = int(hparam(model, "hidden_size")), int(hparam(model, "num_attention_heads"))
        writer.add_block_count(int(hparam(model, "num_hidden_layers")))
        writer.add_context_length(int(hparam(model, "max_position_embeddings")))
        writer.add_embedding_length(n_embd)
        writer.add_feed_forward_length(int(hparam(model, "intermediate_size")))
        writer.add_head_count(n_head)
        writer.add_head_count_kv(int(hparam(model, "num_key_value_heads", default=n_head)))
        rope = model.config.get("rope_scaling") or model.config.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type")) not in (None, "default"):
            raise ConvertError(f"{model.path}/config.json: RoPE scaling {rope!r} is not converted yet")
        writer.add_rope_freq_base(float(model.config.get("rope_theta", rope.get("rope_theta", 10000.0))))
        writer.add_layer_norm_rms_eps(float(hparam(model, "rms_norm_eps")))
        head_dim = model.config.get("head_dim") or n_embd // n_head
        self.extra_metadata(writer, model, int(head_dim))
        add_bpe_vocab(writer, model)

    def extra_metadata(self, writer: Any, model: HFModel, head_dim: int) -> None:
        writer.add_vocab_size(int(hparam(model, "vocab_size")))
        writer.add_rope_dimension_count(head_dim)

    def tensors(self, model: HFModel) -> list[TensorPlan]:
        names = {n: n for n in model.names() if not n.endswith("rotary_emb.inv_freq")}
        if model.config.get("tie_word_embeddings") and "lm_head.weight" in names:
            del names["lm_head.weight"]   # the same matrix as the token embedding: llama.cpp ties them
        plans = map_by_suffix(model, names, LLAMA_LAYER, LLAMA_GLOBAL, "model.layers.")
        if self.permute_qk:
            n_head = int(hparam(model, "num_attention_heads"))
            n_kv = int(hparam(model, "num_key_value_heads", default=n_head))
            for p in plans:
                heads = n_head if ".attn_q." in p.name else n_kv if ".attn_k." in p.name else 0
                if heads:
                    p.read = (lambda r=p.read, h=heads: interleave_rope_rows(r(), h))
        return plans


class Qwen2Converter(LlamaConverter):
    hf_architectures = ("Qwen2ForCausalLM",)
    gguf_arch = "qwen2"
    permute_qk = False

    def extra_metadata(self, writer: Any, model: HFModel, head_dim: int) -> None:
        pass


class Qwen3Converter(Qwen2Converter):
    hf_architectures = ("Qwen3ForCausalLM",)
    gguf_arch = "qwen3"

    def extra_metadata(self, writer: Any, model: HFModel, head_dim: int) -> None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)


GPT2_LAYER = {
    "ln_1.weight": "attn_norm.weight", "ln_1.bias": "attn_norm.bias",
    "attn.c_attn.weight": "attn_qkv.weight", "attn.c_attn.bias": "attn_qkv.bias",
    "attn.c_proj.weight": "attn_output.weight", "attn.c_proj.bias": "attn_output.bias",
    "ln_2.weight": "ffn_norm.weight", "ln_2.bias": "ffn_norm.bias",
    "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.weight": "ffn_down.weight", "mlp.c_proj.bias": "ffn_down.bias",
}
GPT2_GLOBAL = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
               "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}


class GPT2Converter(ArchConverter):
    hf_architectures = ("GPT2LMHeadModel",)
    gguf_arch = "gpt2"

    def set_metadata(self, writer: Any, model: HFModel) -> None:
        writer.add_block_count(int(hparam(model, "n_layer")))
        writer.add_context_length(int(hparam(model, "n_ctx", "n_positions")))
        n_embd = int(hparam(model, "n_embd"))
        writer.add_embedding_length(n_embd)
        writer.add_feed_forward_length(int(model.config.get("n_inner") or 4 * n_embd))
        writer.add_head_count(int(hparam(model, "n_head")))
        writer.add_layer_norm_eps(float(hparam(model, "layer_norm_epsilon")))
        add_bpe_vocab(writer, model)

    def tensors(self, model: HFModel) -> list[TensorPlan]:
        names = {n.removeprefix("transformer."): n for n in model.names()
                 if not n.endswith((".attn.bias", ".attn.masked_bias")) and n != "lm_head.weight"}
        plans = map_by_suffix(model, names, GPT2_LAYER, GPT2_GLOBAL, "h.")
        for p in plans:
            if p.name.endswith(("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")):
                p.read, p.shape = (lambda r=p.read: r().T), p.shape[::-1]    # Conv1D [in, out] -> [out, in]
        return plans
