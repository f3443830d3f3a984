"""make_backends: names and "auto" to backend instances, one BackendOptions record for every factory, and
a priority each instance may set for itself. Also the Op names backends dispatch on."""
from __future__ import annotations

import pytest

from ggflow.backends_builtin.cpu.backend import CPUBackend
from ggflow.core import ops
from ggflow.core.backend import Backend, BackendOptions, HostBuffer
from ggflow.core.backend_registry import make_backends, probed_priority
from ggflow.core.ops import IN_PLACE, PURE_VIEWS, Op
from ggflow.errors import BackendError
from ggflow.plugins import get_plugin_manager, hookimpl


class Ranked(Backend):
    """A backend whose rank is decided per instance, from a class-level knob the tests set."""

    name = "test_ranked"
    rank_found = 5
    built_with: list[BackendOptions] = []

    def __init__(self, options: BackendOptions = BackendOptions()):
        super().__init__(options)
        self.priority = Ranked.rank_found
        Ranked.built_with.append(options)

    def alloc_buffer(self, size):
        return HostBuffer.allocate(size, self.name)

    def compute(self, nodes, substitutes=None):
        pass


class Higher(Ranked):
    name = "test_higher"

    def __init__(self, options: BackendOptions = BackendOptions()):
        super().__init__(options)
        self.priority = 50


class Plugin:
    @hookimpl
    def register_backends(self, register):
        register(Ranked)
        register(Higher)


@pytest.fixture
def ranked():
    manager, plugin = get_plugin_manager(), Plugin()
    manager.register(plugin, "test-ranked-backends")
    Ranked.built_with, Ranked.rank_found = [], 5
    yield Ranked
    manager.unregister(plugin)


def names(backends):
    return [b.name for b in backends]


def test_auto_orders_by_each_instances_priority_and_puts_the_cpu_last(ranked):
    assert names(make_backends("auto"))[:2] == ["test_higher", "test_ranked"]
    assert names(make_backends("auto"))[-1] == "cpu"


def test_auto_leaves_out_an_instance_that_ranks_itself_below_the_cpu(ranked):
    ranked.rank_found = -1
    assert "test_ranked" not in names(make_backends("auto"))
    assert names(make_backends(["test_ranked"])) == ["test_ranked", "cpu"]  # asked for by name: it runs


def test_auto_builds_nothing_whose_probe_ranks_it_below_the_cpu(ranked, monkeypatch):
    from ggflow.core.backend import Availability
    monkeypatch.setattr(Ranked, "is_available", classmethod(lambda cls: Availability(True, "cpu driver", -1)))
    backends = names(make_backends("auto"))          # Higher inherits the probe: it is left out too
    assert "test_ranked" not in backends and "test_higher" not in backends
    assert ranked.built_with == []                   # neither was instantiated to find that out
    assert probed_priority(Ranked) == -1 and probed_priority(CPUBackend) == 0


def test_every_factory_gets_the_same_options_record(ranked):
    backends = make_backends(["test_ranked", "cpu", "test_higher"], n_threads=1)
    assert names(backends) == ["test_ranked", "test_higher", "cpu"]
    assert ranked.built_with == [BackendOptions(n_threads=1)] * 2
    assert all(b.options == BackendOptions(n_threads=1) for b in backends) and backends[-1].n_threads == 1


def test_bad_options_are_refused_before_any_backend_is_built():
    with pytest.raises(BackendError, match="n_threads must be at least 1, got 0"):
        make_backends("cpu", n_threads=0)


def test_a_backend_that_is_not_available_is_refused_by_name(ranked, monkeypatch):
    from ggflow.core.backend import Availability
    monkeypatch.setattr(Ranked, "is_available", classmethod(lambda cls: Availability(False, "no device")))
    with pytest.raises(BackendError, match="'test_ranked' is not available: no device"):
        make_backends(["test_ranked"])
    assert "test_ranked" not in names(make_backends("auto"))


def test_op_names_equal_their_strings_so_plugins_can_compare_either():
    x = ops.new_tensor("F32", (4, 2))
    assert ops.silu(x).op is Op.SILU and ops.silu(x).op == "silu" and {"silu": 1}[ops.silu(x).op] == 1
    assert repr(Op.MUL_MAT) == "'mul_mat'" and f"{Op.MUL_MAT}" == "mul_mat"


def test_pure_views_and_in_place_ops_are_the_ops_that_return_views():
    x, y = ops.new_tensor("F32", (4, 2)), ops.new_tensor("F32", (4, 2))
    views = [ops.view(x, (4,)), ops.reshape(x, 8), ops.transpose(x)]
    writes = [ops.cpy(x, y), ops.set_rows(y, ops.new_tensor("F32", (4, 1)), ops.new_tensor("I32", (1,)))]
    computed = [ops.add(x, y), ops.cont(ops.transpose(x))]
    assert {v.op for v in views} == PURE_VIEWS and {w.op for w in writes} == IN_PLACE
    assert all(t.view_src is not None for t in views + writes)
    assert all(t.view_src is None and t.op not in PURE_VIEWS | IN_PLACE for t in computed)
    assert CPUBackend().supports_op(views[0])
