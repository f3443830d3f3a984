"""Faults leave nothing half-done. A backend that fails in the k-th graph compute makes ``decode`` raise a
BackendError, the KV cache and the LLM's cached tokens stay as they were, and the next generation equals a
fresh LLM's token for token (llama.cpp's contract: a failed ubatch's positions are removed); a fault while
packing weights leaves no memory map behind."""
from __future__ import annotations

import gc
import os

import pytest

from ggflow.api import LLM, default_model_path
from ggflow.errors import BackendError
from tests.fixtures.default_model import MISSING

PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def fresh():
    if MISSING:
        pytest.skip(MISSING)
    llm = LLM(n_ctx=256, n_threads=1, backend="cpu")
    return llm.generate(PROMPT, 12, temperature=0).tokens


def failing_on_call(monkeypatch, scheduler, k: int):
    """The k-th graph compute (1-based) from now raises, as a backend that fails mid-graph would."""
    real, calls = scheduler.compute, {"n": 0}

    def compute(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == k:
            raise BackendError(f"injected fault at compute {k}")
        return real(*args, **kwargs)
    monkeypatch.setattr(scheduler, "compute", compute)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_a_fault_mid_generation_leaves_the_llm_as_a_fresh_one(monkeypatch, fresh, k):
    llm = LLM(n_ctx=256, n_threads=1, backend="cpu")
    llm.generate("Once upon a time", 4, temperature=0)          # something cached before the fault
    before = (llm.context.memory.n_used, llm.context.memory.seq_pos_max(0))
    failing_on_call(monkeypatch, llm.context.scheduler, k)
    with pytest.raises(BackendError, match="injected fault"):
        llm.generate(PROMPT, 12, temperature=0)
    monkeypatch.undo()
    memory = llm.context.memory
    # the failed ubatch left nothing: what is cached is a prefix of what was there (a prompt may have been
    # rewound to its shared prefix before the fault), never a half-written batch
    assert memory.n_used == memory.seq_pos_max(0) + 1 and memory.n_used <= max(before[0], 12 + len(PROMPT))
    assert llm.generate(PROMPT, 12, temperature=0).tokens == fresh


def _mappings_of(path: str) -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if path in line)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts memory maps through /proc (Linux)")
def test_a_fault_while_packing_weights_leaves_no_mapping_behind(monkeypatch, fresh):
    from ggflow.backends_builtin.cpu.backend import CPUBackend

    path = os.path.realpath(default_model_path())
    gc.collect()
    before = _mappings_of(path)
    real, packed = CPUBackend.prepare_weight, {"n": 0}

    def prepare_weight(self, tensor):
        packed["n"] += 1
        if packed["n"] == 5:
            raise BackendError("injected fault while packing the 5th weight")
        return real(self, tensor)
    monkeypatch.setattr(CPUBackend, "prepare_weight", prepare_weight)
    with pytest.raises(BackendError, match="5th weight"):
        LLM(path, n_ctx=256, n_threads=1, backend="cpu")
    monkeypatch.undo()
    gc.collect()
    assert _mappings_of(path) == before            # the half-loaded model's memory map is gone
    assert LLM(path, n_ctx=256, n_threads=1, backend="cpu").generate(PROMPT, 12, temperature=0).tokens == fresh
