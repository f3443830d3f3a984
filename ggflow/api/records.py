"""What a generation returns (moved to ggflow.generation.records; these names stay importable from here)."""
from ggflow.generation.records import FINISH_LENGTH, FINISH_STOP, Completion, Generation, Timings

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "Completion", "Generation", "Timings"]
