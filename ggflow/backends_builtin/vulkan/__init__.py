"""The built-in Vulkan backend plugin (``pip install 'ggflow[vulkan]'``): compute shaders on a GPU.

Importing this package imports nothing from the ``vulkan`` bindings; the backend probes the driver when
asked whether it is available, and reports why not (no package, no loader, no driver, no device).
"""
from __future__ import annotations

from ggflow.backends_builtin.vulkan.backend import VulkanBackend
from ggflow.plugins.hookspecs import hookimpl

__all__ = ["VulkanBackend"]


@hookimpl
def register_backends(register):
    register(VulkanBackend)
