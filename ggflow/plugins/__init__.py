"""The four plugin seams and the manager that discovers and registers plugins."""
from ggflow.plugins.hookspecs import hookimpl, hookspec, ENTRY_POINT_GROUP
from ggflow.plugins.api_version import API_VERSION, PluginAPIWarning
from ggflow.plugins.manager import get_plugin_manager, registries
from ggflow.plugins.removed import RemovedNameError

__all__ = ["hookimpl", "hookspec", "ENTRY_POINT_GROUP", "get_plugin_manager", "registries", "API_VERSION",
           "PluginAPIWarning", "RemovedNameError"]
