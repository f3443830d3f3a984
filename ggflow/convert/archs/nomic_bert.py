"""nomic-embed-text (NomicBertModel) to GGUF arch "nomic-bert", as llama.cpp's NomicBertModel converter writes it.

Two spellings of the same model are read: nomic-ai's own checkpoints (``encoder.layers.N.attn.Wqkv``,
``mlp.fc11`` / ``fc12`` / ``fc2``, ``norm1`` / ``norm2``, ``emb_ln``; config ``n_embd``, ``rotary_emb_base``...)
and transformers' port (``layers.N.self_attn.q_proj`` ..., ``mlp.up_proj`` ..., ``post_attention_layernorm``;
config ``hidden_size``, ``rope_parameters``). Either way the file holds one fused ``attn_qkv`` per layer,
as llama.cpp's. The MoE variant (nomic-bert-moe) and the non-default options nomic's code allows (pre-norm,
partial or interleaved RoPE, biases) are refused: llama.cpp's converter asserts the same.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ggflow.convert.archs.base import hparam, plan
from ggflow.convert.archs.bert import POOLING, BertConverter
from ggflow.convert.source import HFModel
from ggflow.convert.vocab import add_wordpiece_vocab
from ggflow.convert.writer import ConvertError, TensorPlan

GLOBAL = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "emb_ln.weight": "token_embd_norm.weight", "emb_ln.bias": "token_embd_norm.bias",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight", "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
LAYER = {   # nomic-ai's names and transformers' for each GGUF tensor of a layer
    "attn.Wqkv.weight": "attn_qkv.weight",
    "attn.out_proj.weight": "attn_output.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.fc11.weight": "ffn_up.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.fc12.weight": "ffn_gate.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.fc2.weight": "ffn_down.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "norm1.weight": "attn_output_norm.weight", "norm1.bias": "attn_output_norm.bias",
    "post_attention_layernorm.weight": "attn_output_norm.weight",
    "post_attention_layernorm.bias": "attn_output_norm.bias",
    "norm2.weight": "layer_output_norm.weight", "norm2.bias": "layer_output_norm.bias",
    "post_mlp_layernorm.weight": "layer_output_norm.weight", "post_mlp_layernorm.bias": "layer_output_norm.bias",
}
SPLIT_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")   # fused on write
REQUIRED = {"causal": False, "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
            "rotary_emb_scale_base": None, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False}


class NomicBertConverter(BertConverter):
    hf_architectures = ("NomicBertModel",)
    gguf_arch = "nomic-bert"

    def check(self, model: HFModel) -> None:
        config = model.config
        if config.get("moe_every_n_layers"):
            raise ConvertError(f"{model.path}/config.json: nomic-bert-moe (moe_every_n_layers) is not converted")
        for key, want in REQUIRED.items():
            if key in config and config[key] != want:
                raise ConvertError(f"{model.path}/config.json: {key} = {config[key]!r} is not supported "
                                   f"(llama.cpp's nomic-bert needs {want!r})")
        act = config.get("activation_function", config.get("hidden_act", "swiglu"))
        if act not in ("swiglu", "silu"):
            raise ConvertError(f"{model.path}/config.json: activation {act!r} is not supported (nomic-bert: swiglu)")

    def context_length(self, model: HFModel) -> int:
        if "n_positions" in model.config:   # nomic-ai's config, read as llama.cpp's converter reads it
            npos, trained = model.config["n_positions"], model.config.get("max_trained_positions", 2048)
            return 2048 if (npos, trained) == (8192, 2048) else int(min(npos, trained))
        return int(hparam(model, "max_position_embeddings"))

    def set_metadata(self, writer: Any, model: HFModel) -> None:
        self.check(model)
        rope = model.config.get("rope_parameters") or {}
        writer.add_context_length(self.context_length(model))
        writer.add_embedding_length(int(hparam(model, "hidden_size", "n_embd")))
        writer.add_feed_forward_length(int(hparam(model, "intermediate_size", "n_inner")))
        writer.add_block_count(int(hparam(model, "num_hidden_layers", "n_layer")))
        writer.add_head_count(int(hparam(model, "num_attention_heads", "n_head")))
        writer.add_layer_norm_eps(float(hparam(model, "layer_norm_eps", "layer_norm_epsilon", default=1e-12)))
        writer.add_rope_freq_base(float(rope.get("rope_theta") or hparam(model, "rotary_emb_base", "rope_theta",
                                                                          default=1000.0)))
        writer.add_causal_attention(False)
        pooling = self.pooling(model)
        if pooling is not None:
            import gguf

            writer.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
        add_wordpiece_vocab(writer, model)

    def tensors(self, model: HFModel) -> list[TensorPlan]:
        plans, fused = [], {}
        for source in model.names():
            name = source.removeprefix("model.")
            if name in GLOBAL:
                plans.append(plan(model, source, GLOBAL[name]))
                continue
            prefix = next((p for p in ("encoder.layers.", "layers.") if name.startswith(p)), None)
            il, _, suffix = name[len(prefix):].partition(".") if prefix else ("", "", "")
            if il.isdigit() and suffix in LAYER:
                plans.append(plan(model, source, f"blk.{il}.{LAYER[suffix]}"))
            elif il.isdigit() and suffix in SPLIT_QKV:
                fused.setdefault(int(il), {})[suffix] = source
            elif name != "embeddings.position_ids":
                raise ConvertError(f"{model.path}: tensor {source!r} has no GGUF name in this converter")
        for il, parts in sorted(fused.items()):
            if len(parts) != 3:
                raise ConvertError(f"{model.path}: layer {il} has {sorted(parts)} but not all of q, k and v")
            sources = [parts[s] for s in SPLIT_QKV]
            rows = sum(model.shape(s)[0] for s in sources)
            plans.append(TensorPlan(f"blk.{il}.attn_qkv.weight", (rows, model.shape(sources[0])[1]),
                                    lambda s=sources: np.concatenate([model.read(x) for x in s], axis=0)))
        return plans
