"""Stop strings in streamed text (moved to ggflow.generation.stop; the name stays importable from here)."""
from ggflow.generation.stop import StopMatcher

__all__ = ["StopMatcher"]
