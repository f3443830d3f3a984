"""Backends that run only some ops: the KV cache goes where it can be written, weights are copied once to
the backend that runs the nodes reading them, and the scheduler counts its splits and copies."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggflow.core import ops
from ggflow.core.backend import HostBuffer
from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK, Context
from ggflow.core.graph import Graph
from ggflow.core.model import Model
from ggflow.core.ops import Op
from ggflow.core.placement import kv_writes, memory_backend
from ggflow.core import scheduler as scheduler_module
from ggflow.core.scheduler import Scheduler
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.plugins import hookimpl
from ggflow.plugins.manager import get_plugin_manager
from tests.numpy_backend import NumpyTestBackend
from tests.vulkan_harness import requires_vulkan

EXAMPLE_SRC = Path(__file__).resolve().parents[1] / "examples" / "ggflow-example-plugin" / "src"
PROMPT = [5, 17, 42, 100, 7, 3, 250, 12]


class F32MatmulOnly(NumpyTestBackend):
    """Runs mul_mat of F32 by F32, and nothing else (views aside)."""
    name = "f32_matmul"

    def __init__(self, options=None):
        super().__init__(ops=(Op.MUL_MAT,), name="f32_matmul")

    def supports_op(self, node: Tensor) -> bool:
        if node.op != Op.MUL_MAT:
            return super().supports_op(node)
        return all(t.type.name == "F32" for t in (node, *node.src))


class Plugin:
    @hookimpl
    def register_backends(self, register):
        register(F32MatmulOnly)


@pytest.fixture
def backends_registered(monkeypatch):
    """The example plugin (from its source tree) and the F32 matmul backend, registered for one test."""
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    from ggflow_example_plugin import plugin
    manager, ours = get_plugin_manager(), Plugin()
    manager.register(plugin, "example")
    manager.register(ours, "f32-matmul-test")
    yield
    manager.unregister(ours)
    manager.unregister(plugin)


def greedy(model: Model, backends, n: int = 6, **kw) -> tuple[list[int], Context]:
    ctx = Context(model, n_ctx=64, backends=backends, **kw)
    assert ctx.decode(Batch.from_tokens(PROMPT)) == DECODE_OK
    tokens = []
    for i in range(n):
        tokens.append(int(np.argmax(ctx.get_logits_ith(-1))))
        assert ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(PROMPT) + i)) == DECODE_OK
    return tokens, ctx


def test_example_numpy_backend_runs_a_model_in_a_context_with_the_cpus_tokens(backends_registered, tiny_model_path):
    model = Model.load(tiny_model_path("llama"))
    expected, cpu_ctx = greedy(model, "cpu")
    tokens, ctx = greedy(model, ["example_numpy"])
    assert tokens == expected
    assert [b.name for b in ctx.backends] == ["example_numpy", "cpu"]
    assert ctx.memory_backend.name == "cpu"   # it cannot set_rows: the KV cache stays on the CPU
    stats = ctx.scheduler.stats
    ran = {n.op for s in ctx.scheduler.splits if s.backend.name == "example_numpy" for n in s.nodes}
    assert {Op.ADD, Op.MUL} <= ran and not ran & {Op.MUL_MAT, Op.RMS_NORM, Op.SET_ROWS}
    assert stats.n_splits > 2 and stats.n_copies > 0 and stats.bytes_copied > 0
    assert stats.n_splits == len(ctx.scheduler.splits)
    assert stats.n_computes == 1 + 6 and stats.total_copies >= stats.n_copies * 6
    # the norm weights its mul nodes read were copied once, not at every compute
    n_norm_weights = 2 * model.hparams.n_layer + 1
    assert stats.n_weight_copies == n_norm_weights
    assert cpu_ctx.scheduler.stats.n_splits == 1 and cpu_ctx.scheduler.stats.total_copies == 0


def test_an_f32_matmul_only_backend_gets_the_weight_matmuls_with_the_copies_counted(backends_registered,
                                                                                   tiny_model_path):
    model = Model.load(tiny_model_path("llama"))   # F32 weights
    expected, _ = greedy(model, "cpu")
    tokens, ctx = greedy(model, ["f32_matmul"])
    assert tokens == expected
    sched, stats = ctx.scheduler, ctx.scheduler.stats
    [mm_backend] = [b for b in ctx.backends if b.name == "f32_matmul"]
    mms = [n for s in sched.splits for n in s.nodes if n.op == Op.MUL_MAT]
    on_it = [n for n in mms if sched.home[n.id] is mm_backend]
    weights = set(model.weights.values())
    # every matmul by a weight runs on it; the attention matmuls read the F16 cache and stay on the CPU
    assert {n.id for n in on_it} == {n.id for n in mms if n.src[0].base() in weights}
    assert len(on_it) == 7 * model.hparams.n_layer + 1
    assert stats.nodes["f32_matmul"] >= len(on_it)
    assert ctx.memory_backend.name == "cpu"
    # each matmul's activations cross to it and its result crosses back: counted per compute
    per_compute = sum(c.dst.nbytes for s in sched.splits for c in s.copies)
    assert stats.bytes_copied == per_compute > 0
    matrices = {n.src[0].base().name for n in on_it}
    assert stats.n_weight_copies == len(matrices)
    assert stats.weight_bytes_copied == sum(model.weights[name].nbytes for name in matrices)


def test_weights_are_copied_once_across_graphs_and_reuses(backends_registered, tiny_model_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "WEIGHT_BUFFER_BYTES", 1 << 16)   # several weights per buffer
    model = Model.load(tiny_model_path("llama"))
    _, ctx = greedy(model, ["f32_matmul"], n=4)
    after_first = ctx.scheduler.stats.n_weight_copies
    copies = {id(c.dst): c.dst for s in ctx.scheduler.splits for c in s.weight_copies}.values()
    buffers = {id(t.buffer) for t in copies}
    assert 1 < len(buffers) < len(copies) and all(t.buffer.size <= 1 << 16 or t.nbytes > 1 << 16 for t in copies)
    assert ctx.n_graph_builds >= 2   # the prompt's graph and the one-token graph
    assert ctx.decode(Batch.from_tokens([1, 2, 3], pos0=len(PROMPT) + 4)) == DECODE_OK  # a new shape
    assert ctx.scheduler.stats.n_weight_copies == after_first > 0


def test_the_kv_cache_goes_on_the_first_backend_that_can_write_it(tiny_model_path):
    hp = Model.load(tiny_model_path("llama")).hparams
    writes = kv_writes(hp, 64, 8, "F16", "F16")
    no_set_rows = NumpyTestBackend(ops=(Op.ADD,), name="no_set_rows")
    writer = NumpyTestBackend(ops=(Op.SET_ROWS,), name="writer")
    cpu = NumpyTestBackend(name="cpu")
    assert memory_backend([no_set_rows, writer, cpu], writes) is writer
    assert memory_backend([no_set_rows, cpu], writes) is cpu
    assert memory_backend([cpu], writes) is cpu
    assert [w.op for w in writes] == [Op.SET_ROWS, Op.SET_ROWS] and writes[0].src[0].type.name == "F16"


def test_a_backend_that_declines_offload_keeps_cpu_weights_consumers_off_it():
    class Declines(NumpyTestBackend):
        def offload_op(self, node):
            return False

    W = np.arange(48, dtype=np.float32).reshape(6, 8) / 48

    def graph():
        w = Tensor("F32", (8, 6), name="w", flags=TensorFlag.PARAM)
        w.buffer = HostBuffer.allocate(w.nbytes, "cpu")
        w.numpy()[...] = W
        x = ops.new_input("F32", (8, 4), "x")
        return x, ops.mul_mat(w, x)

    for partial, where in ((NumpyTestBackend(ops=(Op.MUL_MAT,), name="p"), "p"),
                           (Declines(ops=(Op.MUL_MAT,), name="p"), "cpu")):
        x, out = graph()
        sched = Scheduler([partial, NumpyTestBackend(name="cpu")])
        sched.alloc(Graph([out]))
        assert sched.home[out.id].name == where
        assert sched.stats.n_weight_copies == (where == "p")
        sched.set_input(x, np.ones((4, 8), np.float32))
        sched.compute(sched.graph)
        np.testing.assert_allclose(sched.get_output(out), np.ones((4, 8)) @ W.T, rtol=1e-6)


def test_a_tensor_a_graph_writes_is_never_copied_as_a_weight():
    cache = Tensor("F32", (4, 8), name="cache", flags=TensorFlag.PARAM)
    cache.buffer = HostBuffer.allocate(cache.nbytes, "cpu")

    def scheduler():
        return Scheduler([NumpyTestBackend(ops=(Op.SCALE,), name="p"),
                          NumpyTestBackend(ops=(Op.SCALE, Op.SET_ROWS), name="cpu")])

    def reader():
        read = ops.scale(ops.view(cache, (4, 8)), 2.0)
        return read, Graph([read])

    read, graph = reader()     # a graph that only reads it: a weight, offloaded and copied once
    fresh = scheduler()
    fresh.alloc(graph)
    assert fresh.home[read.id].name == "p" and fresh.stats.n_weight_copies == 1

    sched = scheduler()        # once a graph has written it, it is state, not a weight
    rows, src = ops.new_input("I32", (2,), "rows"), ops.new_input("F32", (4, 2), "src")
    sched.alloc(Graph([ops.set_rows(cache, src, rows)]))
    read, graph = reader()
    sched.alloc(graph)
    assert sched.stats.n_weight_copies == 0 and sched.home[read.id].name == "cpu"


def test_ggflow_run_verbose_prints_the_backends_and_the_schedulers_stats(backends_registered, tiny_model_path,
                                                                          capsys):
    from ggflow.cli import main
    path = str(tiny_model_path("llama"))
    assert main(["run", "-m", path, "--prompt-ids", "5,17,42", "-n", "3", "--temp", "0", "-c", "64",
                 "--backend", "example_numpy", "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "backends:    example_numpy, cpu; KV cache on cpu" in err
    [line] = [x for x in err.splitlines() if x.startswith("scheduler:")]
    n_splits = int(line.split()[1])
    assert n_splits > 2 and "example_numpy" in line and " 0 copies" not in line.split(";")[1]
    assert main(["run", "-m", path, "--prompt-ids", "5,17,42", "-n", "3", "-c", "64", "--backend", "cpu"]) == 0
    assert "scheduler:" not in capsys.readouterr().err   # only when asked
    assert main(["run", "-m", path, "--prompt-ids", "5,17,42", "-n", "3", "--temp", "0", "-c", "64",
                 "--backend", "example_numpy", "--verbose", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])["scheduler"]
    assert stats["n_splits"] == n_splits and stats["n_computes"] == 3 and stats["total_copies"] > 0


@requires_vulkan
def test_a_device_backend_after_a_partial_one_gets_its_weights_from_the_scheduler(backends_registered,
                                                                                  tiny_model_path, monkeypatch):
    """Vulkan second: nothing offers it the weights (adopt_weights goes to the first backend), so the
    scheduler copies those its nodes read into device buffers, a few weights per buffer here."""
    monkeypatch.setattr(scheduler_module, "WEIGHT_BUFFER_BYTES", 1 << 16)
    model = Model.load(tiny_model_path("llama", "Q8_0"))
    expected, _ = greedy(model, "cpu")
    tokens, ctx = greedy(model, ["example_numpy", "vulkan"])
    assert tokens == expected
    stats = ctx.scheduler.stats
    assert ctx.memory_backend.name == "vulkan"
    assert stats.nodes["vulkan"] > stats.nodes["example_numpy"] > 0
    copied = [c for s in ctx.scheduler.splits for c in s.weight_copies if s.backend.name == "vulkan"]
    assert {c.src.type.name for c in copied} >= {"Q8_0"} and len({id(c.dst.buffer) for c in copied}) > 1
    assert all(c.src.buffer.backend_name == "cpu" for c in copied)   # the model's weights stay where they were


def test_the_k_shift_runs_where_the_cache_is_with_a_partial_backend_first(backends_registered, tiny_model_path):
    model = Model.load(tiny_model_path("llama"))
    logits = []
    for backends in ("cpu", ["example_numpy"]):
        ctx = Context(model, n_ctx=64, backends=backends)
        assert ctx.decode(Batch.from_tokens(PROMPT)) == DECODE_OK
        ctx.memory.seq_rm(0, 0, 3)
        ctx.memory.seq_add(0, 3, -1, -3)          # the K-shift graph re-rotates the cache on the CPU
        assert ctx.decode(Batch.from_tokens([9], pos0=len(PROMPT) - 3)) == DECODE_OK
        logits.append(ctx.get_logits_ith(-1).copy())
    np.testing.assert_allclose(logits[1], logits[0], rtol=0, atol=1e-5 * np.abs(logits[0]).max())
