"""The built-in CPU backend plugin: numba/numpy kernels for every op (see backend.py)."""
from __future__ import annotations

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.plugins.hookspecs import hookimpl

__all__ = ["CPUBackend"]


@hookimpl
def register_backends(register):
    register(CPUBackend)
