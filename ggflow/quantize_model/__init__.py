"""Rewrite a GGUF model in another quantization mix, as llama-quantize does.

Each tensor gets the type llama.cpp's rules give it (mixes.py). A tensor whose type
changes is decoded to float32 with ggflow.dequantize and encoded with ggflow.quantize, which write
the bytes ggml's reference quantizers write, so a tensor that llama-quantize (without an importance
matrix) would produce from the same input has the same bytes. Metadata is copied with its value
types, general.file_type and general.quantization_version are set, and tensors keep their order,
names, shapes and the file's alignment.

One tensor is in memory at a time, and it is converted in slabs of rows, so peak memory is about
one output tensor plus one float32 slab. The output is written to a temporary file beside OUT and
renamed over OUT only once it is complete: an error or Ctrl-C leaves OUT as it was.
"""
from __future__ import annotations

from typing import Any

# The entry points load on first use (PEP 562): the CLI imports mixes.py to list the mixes, and that
# runs this file, which must stay as light as `ggflow --help` needs.
_PUBLIC = {"quantize_model": "pipeline", "QuantizeReport": "report", "TensorResult": "report"}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
