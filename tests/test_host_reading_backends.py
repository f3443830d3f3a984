"""A backend that holds no weights but reads host memory (ggml's supports_buft) is offered the nodes the CPU
would run, by the cost it reports (``op_cost``) and then by priority: an F32-matmul-only plugin backend gets
the attention products of the default quantized model, and the output stays right."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core import ops
from ggflow.core.backend import Backend, HostBuffer
from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK, Context
from ggflow.core.graph import Graph
from ggflow.core.model import Model
from ggflow.core.ops import PURE_VIEWS, Op
from ggflow.core.scheduler import Scheduler
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.plugins import hookimpl
from ggflow.plugins.manager import get_plugin_manager
from tests.fixtures.default_model import needs_model
from tests.numpy_backend import NumpyTestBackend


def _mul_mat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml's mul_mat on numpy views shaped ne[::-1]: out[.., j, i] = dot(a row i, b row j); a's dims 2
    and 3 broadcast over b's (grouped-query attention)."""
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    a4 = np.repeat(np.repeat(a4, b4.shape[0] // a4.shape[0], 0), b4.shape[1] // a4.shape[1], 1)
    return np.matmul(b4.astype(np.float32), np.swapaxes(a4.astype(np.float32), -1, -2))


class AcmeF32Matmul(Backend):
    """A third party's backend: F32 x F32 mul_mat (numpy), nothing else; no weights, no buffers of its own
    that the CPU could not read, and its kernels read any host tensor where it lies."""
    name = "acme_f32mm"
    priority = 5
    reads_host_memory = True
    host_memory = True
    cost = 0.25

    def __init__(self, options=None):
        super().__init__()
        self.ran: list[str] = []

    def alloc_buffer(self, size: int) -> HostBuffer:
        return HostBuffer.allocate(size, self.name)

    def supports_op(self, node: Tensor) -> bool:
        if node.op in PURE_VIEWS:
            return True
        return node.op == Op.MUL_MAT and all(t.type.name == "F32" for t in (node, *node.src))

    def op_cost(self, node: Tensor) -> float | None:
        return self.cost

    def compute(self, nodes, substitutes=None) -> None:
        subs = substitutes or {}
        for node in nodes:
            if node.view_src is not None:
                continue
            a, b = (subs.get(s, s).numpy() for s in node.src)
            node.numpy()[...] = _mul_mat(a, b).reshape(node.numpy().shape)
            self.ran.append(node.name)


class Plugin:
    @hookimpl
    def register_backends(self, register):
        register(AcmeF32Matmul)


@pytest.fixture
def acme_registered():
    manager, plugin = get_plugin_manager(), Plugin()
    manager.register(plugin, "acme-f32mm-test")
    yield
    manager.unregister(plugin)


def _decode(model: Model, backends, prompt: list[int], n: int) -> tuple[list[int], np.ndarray, Context]:
    ctx = Context(model, n_ctx=64, backends=backends, type_k="F32", type_v="F32")
    assert ctx.decode(Batch.from_tokens(prompt)) == DECODE_OK
    first = ctx.get_logits_ith(-1).copy()
    tokens = []
    for i in range(n):
        tokens.append(int(np.argmax(ctx.get_logits_ith(-1))))
        assert ctx.decode(Batch.from_tokens(tokens[-1:], pos0=len(prompt) + i)) == DECODE_OK
    return tokens, first, ctx


@needs_model
def test_an_f32_matmul_only_plugin_runs_the_attention_products_of_the_default_quantized_model(acme_registered):
    from ggflow.api import default_model_path
    model = Model.load(default_model_path())
    assert {t.type.name for t in model.weights.values()} - {"F32"}   # quantized weights: none it can run
    prompt = model.vocab.tokenize("The capital of France is", add_special=True)
    expected, expected_logits, _ = _decode(model, "cpu", prompt, 4)
    tokens, logits, ctx = _decode(model, ["acme_f32mm"], prompt, 4)
    [acme] = [b for b in ctx.backends if b.name == "acme_f32mm"]
    sched = ctx.scheduler
    on_acme = [n for s in sched.splits if s.backend is acme for n in s.nodes if n.view_src is None]
    # kq and kqv of every layer: the products that read the (F32) cache and the activations, no weight
    assert len(on_acme) == 2 * model.hparams.n_layer and {n.op for n in on_acme} == {Op.MUL_MAT}
    weights = set(model.weights.values())
    assert not any(s.base() in weights for n in on_acme for s in n.src)
    assert len(acme.ran) == 2 * model.hparams.n_layer * (1 + 4)   # the prompt and four tokens, all run
    assert sched.stats.n_weight_copies == 0 and sched.stats.n_copies == 0   # read where they lie
    assert all("op_cost 0.25" in sched.why[n.id] for n in on_acme)
    # numpy's F32 products against the CPU's: the same tokens and top 5. SmolLM2's residual stream reaches
    # ~2e4 and each layer quantizes it to Q8_1 for the Q4_1 products, so rounding moves its logits a lot:
    # the same numpy products accumulated in F64 instead of F32 move them by up to 0.53 (2.6% of the
    # largest). Hence 5% of the largest logit, and the tiny model below checks the products tightly.
    assert tokens == expected
    assert set(np.argsort(-logits)[:5]) == set(np.argsort(-expected_logits)[:5])
    np.testing.assert_allclose(logits, expected_logits, rtol=0, atol=0.05 * np.abs(expected_logits).max())


def test_on_a_small_quantized_model_the_products_it_runs_give_the_cpus_logits(acme_registered, tiny_model_path):
    model = Model.load(tiny_model_path("llama", "Q8_0"))
    prompt = [5, 17, 42, 100, 7, 3, 250, 12]
    expected, expected_logits, _ = _decode(model, "cpu", prompt, 4)
    tokens, logits, ctx = _decode(model, ["acme_f32mm"], prompt, 4)
    assert ctx.scheduler.stats.nodes["acme_f32mm"] >= 2 * model.hparams.n_layer
    assert tokens == expected
    np.testing.assert_allclose(logits, expected_logits, rtol=0, atol=1e-4 * np.abs(expected_logits).max())


def _product_graph():
    w = Tensor("F32", (8, 6), name="w", flags=TensorFlag.PARAM)
    w.buffer = HostBuffer.allocate(w.nbytes, "cpu")
    w.numpy()[...] = np.arange(48, dtype=np.float32).reshape(6, 8) / 48
    x = ops.new_input("F32", (8, 4), "x")
    return w, x, ops.silu(ops.mul_mat(w, x))


class Reader(NumpyTestBackend):
    reads_host_memory = True
    host_memory = True

    def __init__(self, name: str, cost: float | None, ops=(Op.MUL_MAT,)):
        super().__init__(ops=ops, name=name)
        self.cost = cost

    def op_cost(self, node):
        return self.cost


class HostCPU(NumpyTestBackend):
    """The fallback as the CPU backend is: host memory, and it reads any host buffer."""
    reads_host_memory = True
    host_memory = True


def _placed(*backends) -> tuple[str, Scheduler, Tensor]:
    w, x, out = _product_graph()
    sched = Scheduler([*backends, HostCPU(name="cpu")])
    sched.alloc(Graph([out]))
    sched.set_input(x, np.ones((4, 8), np.float32))
    sched.compute(sched.graph)
    mm = out.src[0]
    expected = np.ones((4, 8)) @ w.numpy().reshape(6, 8).T
    np.testing.assert_allclose(sched.get_output(out), expected / (1 + np.exp(-expected)), rtol=1e-6)
    return sched.home[mm.id].name, sched, mm


def test_the_cheapest_host_reader_takes_the_node_then_the_earlier_by_priority():
    # the weight's node goes to a reader (pass 1 offers it the CPU's weight); no copy: it reads the map
    where, sched, mm = _placed(Reader("a", 0.5), Reader("b", 0.2))
    assert where == "a" and sched.stats.n_weight_copies == 0 and sched.stats.n_copies == 0
    # a node placed on the CPU by its neighbours: the cheaper reader, whatever its rank
    where, sched, mm = _placed(Reader("a", 0.5, ops=(Op.SILU,)), Reader("b", 0.2, ops=(Op.SILU,)))
    out = sched.graph.nodes[-1]
    assert sched.home[out.id].name == "b" and "op_cost 0.2" in sched.why[out.id]
    where, sched, _ = _placed(Reader("a", 0.3, ops=(Op.SILU,)), Reader("b", 0.3, ops=(Op.SILU,)))
    assert sched.home[sched.graph.nodes[-1].id].name == "a"   # a tie: priority order


def test_a_reader_that_reports_no_gain_or_no_cost_gets_nothing():
    for cost in (1.0, 3.0, None):
        _, sched, _ = _placed(Reader("a", cost, ops=(Op.SILU,)))
        assert sched.home[sched.graph.nodes[-1].id].name == "cpu"


def test_a_backend_that_cannot_read_host_memory_is_not_offered_the_cpus_nodes():
    class Device(Reader):
        reads_host_memory = False

    _, sched, _ = _placed(Device("d", 0.1, ops=(Op.SILU,)))
    assert sched.home[sched.graph.nodes[-1].id].name == "cpu"


@needs_model
def test_ggflow_run_verbose_says_why_each_split_went_where(acme_registered, capsys):
    from ggflow.cli import main
    assert main(["run", "--prompt-ids", "1,2,3", "-n", "2", "--temp", "0", "-c", "64", "--backend", "acme_f32mm",
                 "--cache-type-k", "f32", "--cache-type-v", "f32", "--verbose"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("split")]
    assert len(lines) > 2
    acme = [x for x in lines if "acme_f32mm" in x]
    assert acme and all("reads its sources in host memory, op_cost 0.25" in x for x in acme)
    assert any("cpu" in x and "reads a weight held here" in x for x in lines)
