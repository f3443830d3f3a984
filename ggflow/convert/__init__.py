"""``ggflow convert``: a Hugging Face model directory (config.json, safetensors or PyTorch weights,
tokenizer files) to a GGUF file with the metadata keys, tensor names and tokenizer fields llama.cpp's
convert_hf_to_gguf.py writes, so a file converted by either tool loads in both.

source.py opens the directory (tensors read lazily), archs/ holds one converter per architecture family,
vocab.py writes the tokenizer, writer.py picks tensor types and writes the file (temporary file, renamed).
"""
from __future__ import annotations

import os

from ggflow.convert.archs.base import ArchConverter
from ggflow.convert.source import open_hf_model
from ggflow.convert.writer import OUTTYPES, ConvertError, write_gguf


def converters() -> list[ArchConverter]:
    from ggflow.convert.archs.bert import BertConverter
    from ggflow.convert.archs.decoders import GPT2Converter, LlamaConverter, Qwen2Converter, Qwen3Converter
    from ggflow.convert.archs.nomic_bert import NomicBertConverter

    return [BertConverter(), NomicBertConverter(), LlamaConverter(), Qwen2Converter(), Qwen3Converter(), GPT2Converter()]


def supported_architectures() -> list[str]:
    return sorted(a for c in converters() for a in c.hf_architectures)


def converter_for(architecture: str, where: str) -> ArchConverter:
    for c in converters():
        if architecture in c.hf_architectures:
            return c
    raise ConvertError(f"{where}: architecture {architecture or '(none in config.json)'!r} is not supported; "
                       f"supported: {', '.join(supported_architectures())}")


def convert(hf_dir: str | os.PathLike, out: str | os.PathLike, outtype: str = "f16", progress: bool = True) -> str:
    """Convert the model in hf_dir to the GGUF file out; returns its general.architecture."""
    if outtype not in OUTTYPES:
        raise ConvertError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    model = open_hf_model(hf_dir)
    conv = converter_for(model.architecture, f"{model.path}/config.json")
    plans = conv.tensors(model)

    def set_metadata(writer) -> None:
        name = model.config.get("_name_or_path") or model.path.name
        writer.add_name(os.path.basename(str(name).rstrip("/")) or model.path.name)
        conv.set_metadata(writer, model)

    write_gguf(out, conv.gguf_arch, set_metadata, plans, outtype, progress)
    return conv.gguf_arch


__all__ = ["convert", "ConvertError", "OUTTYPES", "supported_architectures"]
