"""BERT (BertModel, BertForMaskedLM, BertForSequenceClassification) to GGUF arch "bert".

Names and keys as llama.cpp's BertModel converter writes them, with one difference: a
BertForSequenceClassification's pooler (dense + tanh on [CLS]) is kept as ``cls`` and its classifier
as ``cls.output``, ggml's rank head (tanh(cls x) then cls.output), so the scores are transformers'.
llama.cpp's converter drops the pooler and its scores for such a model differ from transformers'.
"""
from __future__ import annotations

from typing import Any

from ggflow.convert.archs.base import ArchConverter, hparam, map_by_suffix
from ggflow.convert.source import HFModel
from ggflow.convert.vocab import add_wordpiece_vocab
from ggflow.convert.writer import ConvertError, TensorPlan

POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}   # gguf.PoolingType

LAYER = {
    "attention.self.query.weight": "attn_q.weight", "attention.self.query.bias": "attn_q.bias",
    "attention.self.key.weight": "attn_k.weight", "attention.self.key.bias": "attn_k.bias",
    "attention.self.value.weight": "attn_v.weight", "attention.self.value.bias": "attn_v.bias",
    "attention.output.dense.weight": "attn_output.weight", "attention.output.dense.bias": "attn_output.bias",
    "attention.output.LayerNorm.weight": "attn_output_norm.weight",
    "attention.output.LayerNorm.bias": "attn_output_norm.bias",
    "intermediate.dense.weight": "ffn_up.weight", "intermediate.dense.bias": "ffn_up.bias",
    "output.dense.weight": "ffn_down.weight", "output.dense.bias": "ffn_down.bias",
    "output.LayerNorm.weight": "layer_output_norm.weight", "output.LayerNorm.bias": "layer_output_norm.bias",
}
GLOBAL = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight", "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
CLASSIFIER = {"pooler.dense.weight": "cls.weight", "pooler.dense.bias": "cls.bias",
              "classifier.weight": "cls.output.weight", "classifier.bias": "cls.output.bias",
              "classifier.dense.weight": "cls.weight", "classifier.dense.bias": "cls.bias",
              "classifier.out_proj.weight": "cls.output.weight", "classifier.out_proj.bias": "cls.output.bias"}
DROPPED = ("embeddings.position_ids", "pooler.", "cls.predictions", "cls.seq_relationship")


def _hf_name(name: str) -> str:
    """bert.x -> x; old checkpoints' LayerNorm gamma/beta -> weight/bias."""
    name = name.removeprefix("bert.")
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    return name


class BertConverter(ArchConverter):
    hf_architectures = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")
    gguf_arch = "bert"

    def is_classifier(self, model: HFModel) -> bool:
        return model.architecture.endswith("ForSequenceClassification")

    def set_metadata(self, writer: Any, model: HFModel) -> None:
        writer.add_context_length(int(hparam(model, "max_position_embeddings")))
        writer.add_embedding_length(int(hparam(model, "hidden_size")))
        writer.add_feed_forward_length(int(hparam(model, "intermediate_size")))
        writer.add_block_count(int(hparam(model, "num_hidden_layers")))
        writer.add_head_count(int(hparam(model, "num_attention_heads")))
        writer.add_layer_norm_eps(float(hparam(model, "layer_norm_eps", default=1e-12)))
        writer.add_causal_attention(False)
        pooling = self.pooling(model)
        if pooling is not None:
            import gguf

            writer.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
        labels = model.config.get("id2label")
        if self.is_classifier(model) and labels and not (len(labels) == 2 and labels.get("0") == "LABEL_0"):
            writer.add_classifier_output_labels([v for _, v in sorted(labels.items(), key=lambda kv: int(kv[0]))])
        add_wordpiece_vocab(writer, model)

    def pooling(self, model: HFModel) -> str | None:
        """rank for a classifier; else what sentence-transformers' Pooling module says (modules.json)."""
        if self.is_classifier(model):
            return "rank"
        modules = model.json("modules.json")
        if not isinstance(modules, list):
            return None
        path = next((m.get("path") for m in modules if m.get("type", "").endswith("Pooling")), None)
        config = model.json(f"{path}/config.json") if path else None
        if not config:
            return None
        for key, kind in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                          ("pooling_mode_lasttoken", "last")):
            if config.get(key):
                return kind
        raise ConvertError(f"{model.path}/{path}/config.json: only mean, cls and last-token pooling are supported")

    def tensors(self, model: HFModel) -> list[TensorPlan]:
        renamed = {_hf_name(n): n for n in model.names()}
        classifier = self.is_classifier(model)
        global_map = {**GLOBAL, **(CLASSIFIER if classifier else {})}

        def skip(name: str) -> bool:
            return name not in global_map and name.startswith(DROPPED)

        return map_by_suffix(model, renamed, LAYER, global_map, "encoder.layer.", skip)
