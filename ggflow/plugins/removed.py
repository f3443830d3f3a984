"""Names removed from the plugin-facing modules, and the error that says what replaced each.

A plugin importing a removed name gets ``RemovedNameError`` (an ``ImportError``, so ``from m import X``
shows its message rather than Python's bare "cannot import name") naming the replacement and the API
version that removed it. Each plugin-facing module ends with ``__getattr__ = removed_names(__name__)``.
Entries stay at least one minor version after the removal; docs/plugins.md lists them too.
"""
from __future__ import annotations

from typing import Any, Callable

from ggflow.errors import GGFlowError


class RemovedNameError(GGFlowError, ImportError):
    """A name a plugin used is gone from ggflow's plugin API; the message says what replaced it."""


# module -> name -> (what replaces it, the API version that removed it)
REMOVED: dict[str, dict[str, tuple[str, str]]] = {
    "ggflow.core.arch": {
        "TensorShapes": ("a weights record: declare the architecture's tensors as a dataclass of "
                         "ggflow.core.weights tensor / optional / per_layer fields and set it as "
                         "Architecture.weights (the loader checks shapes against it)", "2.0"),
    },
    "ggflow.core.ops": {
        "OPS": ("ggflow.core.ops.Op, a StrEnum of the op names (a plugin's own op may be any other string)",
                "2.0"),
    },
}


def removed_names(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that raises RemovedNameError for the module's removed names and the
    usual AttributeError for anything else."""
    gone = REMOVED.get(module, {})

    def __getattr__(name: str) -> Any:
        if name in gone:
            replacement, version = gone[name]
            raise RemovedNameError(f"{module}.{name} was removed in ggflow's plugin API {version}: "
                                   f"use {replacement}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
