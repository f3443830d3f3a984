"""An architecture plugin, as docs/plugins.md writes one: declared weights, a graph from the builder's blocks."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from ggflow.core.batch import Batch
from ggflow.core.context import DECODE_OK, Context
from ggflow.core.model import Model
from ggflow.errors import ModelLoadError
from ggflow.plugins import get_plugin_manager
from tests.fixtures.tiny_models import rewrite_model

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def documented_example() -> str:
    """The first python block of the docs' Architectures section."""
    section = DOCS.read_text().split("## Architectures\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def mini_llama(monkeypatch):
    plugin = types.ModuleType("mini_llama_from_docs")
    monkeypatch.setitem(sys.modules, plugin.__name__, plugin)   # dataclasses look their module up
    exec(compile(documented_example(), str(DOCS), "exec"), plugin.__dict__)
    get_plugin_manager().register(plugin)
    try:
        yield plugin
    finally:
        get_plugin_manager().unregister(plugin)


def logits(path) -> np.ndarray:
    ctx = Context(Model.load(path), n_ctx=32, type_k="F32", type_v="F32", backends="cpu")
    assert ctx.decode(Batch.from_tokens([5, 17, 42, 100, 7], all_logits=True)) == DECODE_OK
    return ctx.get_logits().copy()


def test_the_documented_architecture_runs_a_llama_file_as_llama_does(mini_llama, tiny_model_path, tmp_path):
    llama = tiny_model_path("llama")
    renamed = rewrite_model(llama, tmp_path / "mini.gguf", arch="mini_llama")
    model = Model.load(renamed)
    assert isinstance(model.arch, mini_llama.MiniLlama)
    assert model.w.layers[1].wq is model.weights["blk.1.attn_q.weight"]
    np.testing.assert_array_equal(logits(renamed), logits(llama))


def test_the_documented_architecture_names_a_missing_tensor(mini_llama, tiny_model_path, tmp_path):
    path = rewrite_model(tiny_model_path("llama"), tmp_path / "mini.gguf", arch="mini_llama",
                         drop="blk.0.ffn_gate.weight")
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_gate\.weight.*missing"):
        Model.load(path)
