"""A request to the engine and its events (they live in ggflow.generation.request, beneath both doors)."""
from ggflow.generation.request import (Done, EngineStoppedError, Event, Piece, PromptTooLongError, QueueFullError,
                                       Request)

__all__ = ["Done", "EngineStoppedError", "Event", "Piece", "PromptTooLongError", "QueueFullError", "Request"]
