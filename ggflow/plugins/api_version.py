"""The plugin API's version, and what a plugin gets when it was written for another one.

``API_VERSION`` is "major.minor": the minor grows when the plugin-facing modules gain something, the
major when something a plugin may use changes or goes. A plugin module (or object) may declare the
version it was written for as ``GGFLOW_API_VERSION = "3.0"``: another major is refused when the plugin
registers (a ``PluginError`` saying both versions, recorded like any failed plugin), a newer minor
only warns (the plugin may reach for something this ggflow lacks). A plugin that declares nothing is
taken as it is. docs/plugins.md keeps the list of changes per version.
"""
from __future__ import annotations

import warnings
from typing import Any

from ggflow.errors import PluginError

API_VERSION = "3.0"


class PluginAPIWarning(UserWarning):
    """A plugin was written for a newer minor version of the plugin API than this ggflow provides."""


def parse_version(text: Any, who: str) -> tuple[int, int]:
    """"3.0" -> (3, 0); anything else is a PluginError naming ``who`` declared it."""
    parts = text.split(".") if isinstance(text, str) else ()
    if len(parts) != 2 or not all(p.isascii() and p.isdecimal() for p in parts):
        raise PluginError(f"{who} declares GGFLOW_API_VERSION = {text!r}: expected \"major.minor\" such as "
                          f"{API_VERSION!r}")
    return int(parts[0]), int(parts[1])


def check_plugin_api(plugin: Any, who: str) -> None:
    """Refuse a plugin written for another major version of the API; warn for a newer minor one."""
    declared = getattr(plugin, "GGFLOW_API_VERSION", None)
    if declared is None:
        return
    major, minor = parse_version(declared, who)
    ours_major, ours_minor = parse_version(API_VERSION, "ggflow")
    if major != ours_major:
        raise PluginError(f"{who} was written for ggflow's plugin API {declared}, this ggflow provides "
                          f"{API_VERSION}: see docs/plugins.md, 'Changes for plugin authors', then update "
                          f"the plugin and its GGFLOW_API_VERSION")
    if minor > ours_minor:
        warnings.warn(f"{who} was written for ggflow's plugin API {declared}, newer than this ggflow's "
                      f"{API_VERSION}: upgrade ggflow if the plugin fails", PluginAPIWarning, stacklevel=3)
