"""Serving: many sequences over one KV cache, one decode per step for all of them (continuous batching).

    engine = Engine.load(model_path, n_ctx=8192, n_slots=4)
    engine.start()                                   # the engine thread owns the Context
    engine.submit(Request(prompt_tokens, on_event=sink.put, max_tokens=64))

``ggflow.serving.app`` puts the OpenAI-compatible HTTP routes on an engine (``ggflow serve``);
The engine itself lives in ``ggflow.generation`` (``LLM`` runs it too); ``ggflow.generation.batch.generate_many``
runs it without HTTP over a list of prompts.
"""
from ggflow.serving.engine import Engine
from ggflow.serving.request import (Done, EngineStoppedError, Piece, PromptTooLongError, QueueFullError, Request)

__all__ = ["Engine", "Request", "Piece", "Done", "QueueFullError", "PromptTooLongError", "EngineStoppedError"]
