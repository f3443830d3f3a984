"""The plugin API says when it changes: GGFLOW_API_VERSION checks and removed names that name their replacement."""
from __future__ import annotations

import importlib
import warnings

import pytest

from ggflow.errors import GGFlowError, PluginError
from ggflow.plugins import API_VERSION, PluginAPIWarning, RemovedNameError, hookimpl
from ggflow.plugins.manager import PluginManager
from ggflow.plugins.removed import REMOVED

MAJOR, MINOR = (int(p) for p in API_VERSION.split("."))


class PickFirst:
    name = "test_api_pick_first"

    def apply(self, cur):
        cur.selected = 0


class Plugin:
    def __init__(self, version):
        if version is not None:
            self.GGFLOW_API_VERSION = version

    @hookimpl
    def register_samplers(self, register):
        register(PickFirst)


def test_a_plugin_for_this_version_or_none_registers_silently():
    for version in (API_VERSION, f"{MAJOR}.0", None):
        manager = PluginManager(autoload=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            manager.register(Plugin(version), "fits")
        assert "test_api_pick_first" in manager.samplers


@pytest.mark.parametrize("version", [f"{MAJOR - 1}.9", f"{MAJOR + 1}.0"])
def test_a_plugin_for_another_major_version_is_refused_naming_both(version):
    manager = PluginManager(autoload=False)
    with pytest.raises(PluginError) as err:
        manager.register(Plugin(version), "old")
    assert version in str(err.value) and API_VERSION in str(err.value) and "old" in str(err.value)
    assert "test_api_pick_first" not in manager.samplers


def test_a_plugin_for_a_newer_minor_version_registers_with_a_warning():
    manager = PluginManager(autoload=False)
    with pytest.warns(PluginAPIWarning, match=f"{MAJOR}.{MINOR + 1}"):
        manager.register(Plugin(f"{MAJOR}.{MINOR + 1}"), "newer")
    assert "test_api_pick_first" in manager.samplers


@pytest.mark.parametrize("version", ["3", "three.0", 3.0, "3.0.1", "٣.0", ""])
def test_a_malformed_declaration_is_refused_saying_the_expected_form(version):
    with pytest.raises(PluginError, match="major.minor"):
        PluginManager(autoload=False).register(Plugin(version), "odd")


@pytest.mark.parametrize("module, name", [(m, n) for m, names in REMOVED.items() for n in names])
def test_a_removed_name_raises_an_error_naming_its_replacement(module, name):
    replacement, version = REMOVED[module][name]
    with pytest.raises(RemovedNameError) as err:
        exec(f"from {module} import {name}", {})
    message = str(err.value)
    assert f"{module}.{name}" in message and replacement in message and version in message
    assert isinstance(err.value, ImportError) and isinstance(err.value, GGFlowError)


@pytest.mark.parametrize("module", ["ggflow.core.arch", "ggflow.core.weights", "ggflow.core.graph_builder",
                                    "ggflow.core.ops", "ggflow.core.sampling", "ggflow.core.types",
                                    "ggflow.core.backend"])
def test_other_missing_names_are_plain_attribute_errors(module):
    mod = importlib.import_module(module)
    assert not hasattr(mod, "no_such_name_anywhere")
    with pytest.raises(ImportError, match="cannot import name"):
        exec(f"from {module} import no_such_name_anywhere", {})


def test_the_changes_list_in_the_docs_names_every_removed_name():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    assert f"API_VERSION = \"{API_VERSION}\"" in doc or f"`{API_VERSION}`" in doc
    for module, names in REMOVED.items():
        for name in names:
            assert f"{module}.{name}" in doc, f"docs/plugins.md does not list the removed {module}.{name}"


def test_the_docs_list_every_graph_op_and_every_graph_builder_block():
    import inspect
    import re
    from pathlib import Path

    from ggflow.core.graph_builder import GraphBuilder
    from ggflow.core.ops import Op
    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    op_cells = {cell for row in re.findall(r"^\| (`[^|]+`) \|", doc, re.M) for cell in re.findall(r"`(\w+)`", row)}
    assert not [op.value for op in Op if op.value not in op_cells], "ops missing from docs/plugins.md's op table"
    blocks = {name for name, _ in inspect.getmembers(GraphBuilder) if not name.startswith("_")}
    documented = set(re.findall(r"^\| `(\w+)[(`]", doc, re.M))
    assert blocks <= documented, f"GraphBuilder blocks missing from docs/plugins.md: {sorted(blocks - documented)}"


def test_the_moved_cpu_pieces_module_says_where_it_went():
    import sys
    sys.modules.pop("ggflow.backends_builtin.cpu.qmm_pieces", None)
    with pytest.raises(RemovedNameError, match="ggflow.plugins.cpu_pieces"):
        from ggflow.backends_builtin.cpu.qmm_pieces import BlockPieces  # noqa: F401
    from ggflow.plugins.cpu_pieces import BlockPieces, tile_rows  # noqa: F401  (the contract's home)
