"""ggflow: run GGUF language models in Python, built the way ggml/llama.cpp is, with plugin seams.

    import ggflow
    llm = ggflow.LLM()                 # the default model, or ggflow.LLM("model.gguf", n_ctx=4096)
    llm.generate("Once upon a time", max_tokens=32).text

The public names load on first use (``import ggflow`` itself imports nothing heavy).
"""
from __future__ import annotations

import importlib
from typing import Any

from ggflow import _numba_setup  # noqa: F401  (first: where numba caches, set before numba loads; os only)

__version__ = "0.1.0"

_WHERE = {
    "LLM": "ggflow.api.llm", "Completion": "ggflow.api.records", "SamplingParams": "ggflow.core.sampling",
    "default_model_path": "ggflow.api.model_path", "quantize": "ggflow.core.quants",
    "dequantize": "ggflow.core.quants", "LlamaPromptLookupDecoding": "ggflow.generation.speculative",
    "LlamaDraftModel": "ggflow.generation.speculative",
    "LlamaRAMCache": "ggflow.api.llama_cache", "LlamaDiskCache": "ggflow.api.llama_cache",
    "LlamaCache": "ggflow.api.llama_cache",
}
_MODULES = ("errors", "api")
__all__ = sorted([*_WHERE, *_MODULES, "Llama", "__version__"])


def __getattr__(name: str) -> Any:
    if name == "Llama":  # llama-cpp-python's name: `from ggflow import Llama` ports a script
        return __getattr__("LLM")
    if name in _MODULES:
        value = importlib.import_module(f"ggflow.{name}")
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'ggflow' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
