"""A loaded model's Python objects kept out of the garbage collector's full passes.

Loading a model leaves ~130k long-lived Python objects (metadata, the vocabulary, the plans' bound kernels).
CPython's cyclic collector walks all of them in every full (generation 2) collection: once in 400
four-sequence decode steps of SmolLM2, a 43 ms stall for every stream, and ~8 ms inside most new graphs'
builds (a new prompt length, the attended range growing by 256 cells), whose ~6000 new tensors set one off.
``gc.freeze()`` moves what exists now into a permanent generation that the collector skips, CPython's own
advice for a server that loads once (docs/performance.md, "Per-step overhead"). It is process-wide, so only
ggflow's own processes call it, after loading: the CLI commands, ``ggflow serve`` and its Ray replicas; an
application that imports ggflow decides for its own heap.
"""
from __future__ import annotations

import gc


def freeze_loaded_objects() -> None:
    """Collect the load's garbage, then freeze what is left (frozen objects are never collected)."""
    gc.collect()
    gc.freeze()
