"""make_backends: the backends a Context runs on, built from their registered names.

Each backend factory is called with one ``BackendOptions`` record, so an option every backend may take
(``n_threads``) reaches each the same way. ``"auto"`` ranks the available backends by their priority,
which an instance may set from what it found (the Vulkan backend on a GPU or on a CPU driver).
"""
from __future__ import annotations

from typing import Sequence

from ggflow.core.backend import Backend, BackendOptions
from ggflow.errors import BackendError

CPU = "cpu"   # the fallback that runs every op: always present, always last


def make_backends(names: "str | Sequence[str]" = "auto", n_threads: int | None = None,
                  options: BackendOptions | None = None) -> list[Backend]:
    """Instantiate backends by name ("auto": every available one by priority); the CPU always comes last.

    "auto" leaves out backends ranked below the CPU (negative priority, e.g. Vulkan on a CPU driver):
    they are slower than the CPU backend and run only when asked for by name. ``options`` (default:
    ``BackendOptions(n_threads=n_threads)``) is passed to every backend factory.
    """
    from ggflow.plugins.manager import get_plugin_manager

    options = options if options is not None else BackendOptions(n_threads=n_threads)
    registry = get_plugin_manager().backends
    auto = names == "auto"
    if auto:
        # ranked before anything is built: a backend left out (a CPU driver) never opens its device
        factories = [r.obj for r in registry if r.name != CPU and probed_priority(r.obj) >= 0]
    else:
        factories = [registry.get(n) for n in ([names] if isinstance(names, str) else names) if n != CPU]
    backends = [_build(factory, options) for factory in factories]
    if auto:
        backends = sorted((b for b in backends if b.priority >= 0), key=lambda b: -b.priority)
    return backends + [_build(registry.get(CPU), options)]


def probed_priority(factory: type[Backend]) -> int:
    """The priority the backend reports for this machine; below 0 when it is unavailable."""
    availability = factory.is_available()
    if not availability:
        return -1
    return factory.priority if availability.priority is None else availability.priority


def _build(factory: type[Backend], options: BackendOptions) -> Backend:
    availability = factory.is_available()
    if not availability:
        raise BackendError(f"backend {factory.name!r} is not available: {availability.reason}")
    return factory(options)


__all__ = ["make_backends", "probed_priority"]
