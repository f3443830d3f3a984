"""The high-level API: ``LLM`` loads a model and generates text, streamed or not, plain or chat, with
llama-cpp-python's ``Llama`` methods (see docs/api.md).

    llm = ggflow.LLM()                                   # the embedded default model
    print(llm.generate("The capital of France is", max_tokens=16).text)
    for piece in llm.generate("Once upon a time", max_tokens=64, stream=True):
        print(piece, end="", flush=True)
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])
    llm("Q: Name a planet. A:", max_tokens=8, stop="\\n")["choices"][0]["text"]

Modules: llm (the class: an engine of ggflow.generation with one slot), completions and chat
(llama-cpp-python's methods), tokens, state, shapes (the returned dicts), arguments (checks shared with the
CLI and server), memory_estimate, serialize; records, stop and logprobs re-export ggflow.generation's names.
Names load on first use, so importing this package is cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "LLM": "llm", "Completion": "records", "Timings": "records", "Generation": "records",
    "FINISH_STOP": "records", "FINISH_LENGTH": "records", "StopMatcher": "stop",
    "default_model_path": "model_path", "LLMState": "state", "TokenLogprob": "logprobs",
    "DetokenizedBytes": "tokens",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ggflow.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ggflow.api.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
