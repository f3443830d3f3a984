"""The four plugin seams and the manager that discovers and registers plugins."""
from ggflow.plugins.hookspecs import hookimpl, hookspec, ENTRY_POINT_GROUP
from ggflow.plugins.manager import get_plugin_manager, registries

__all__ = ["hookimpl", "hookspec", "ENTRY_POINT_GROUP", "get_plugin_manager", "registries"]
