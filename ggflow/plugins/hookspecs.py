"""The four seams of ggflow. Each hook hands the plugin a ``register`` callback; see docs/plugins.md."""
from __future__ import annotations

from typing import Any, Callable

import pluggy

ENTRY_POINT_GROUP = "ggflow"
hookspec = pluggy.HookspecMarker("ggflow")
hookimpl = pluggy.HookimplMarker("ggflow")

Register = Callable[[Any], None]


@hookspec
def register_architectures(register: Register) -> None:
    """Register model architectures: ggflow.core.arch.Architecture instances (``names``, ``weights``, ``build_graph``)."""


@hookspec
def register_quant_types(register: Register) -> None:
    """Register tensor types: ``ggflow.core.types.TypeTraits`` instances."""


@hookspec
def register_backends(register: Register) -> None:
    """Register compute backends: ``ggflow.core.backend.Backend`` subclasses (the class is the factory)."""


@hookspec
def register_samplers(register: Register) -> None:
    """Register samplers: factories (usually classes) with a ``name`` that build a Sampler."""
