"""The engine the server runs (it lives in ggflow.generation.engine, beneath both the server and ``LLM``)."""
from ggflow.generation.engine import Engine

__all__ = ["Engine"]
