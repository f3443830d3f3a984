"""Every ```python block of README.md and docs/*.md runs, so the examples cannot drift from the code.

The blocks of one file run in order in one namespace (as a reader types them), which starts with what the
prose assumes: ``llm`` (the default model; ``path`` its file), its ``vocab``, ``prompt_tokens`` (also ``tokens``), their
``logits`` and some ``generated`` tokens, in a working directory where "model.gguf" is the default model and "model-f32.gguf" a
tiny F32 llama (tests/fixtures). A block whose first
line is ``# not run: <reason>`` (a file of a hypothetical package, a model the tests do not have) is
skipped with that reason.
"""
from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

from ggflow.errors import GGFlowError

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)
NOT_RUN = "# not run:"


def _blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


# the documents that show Python (the others have nothing to run)
DOCS = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if _blocks(p)]


def test_readme_and_the_api_docs_have_examples_to_run():
    assert {"README.md", "api.md", "structured-output.md"} <= {p.name for p in DOCS}


@pytest.fixture(scope="module")
def prelude(tmp_path_factory):
    from ggflow.api import LLM, default_model_path
    try:
        path = default_model_path()
    except GGFlowError as exc:
        pytest.skip(str(exc))
    where = tmp_path_factory.mktemp("docs")
    for name in ("model.gguf", os.path.basename(path)):
        (where / name).symlink_to(path)
    from tests.fixtures.tiny_models import write_tiny_model
    write_tiny_model(where / "model-f32.gguf", "llama")
    llm = LLM(n_ctx=256, backend="cpu")
    prompt_tokens = llm.tokenize("The capital of France is")
    logits, _ = llm.eval_prompt(prompt_tokens)
    generated = llm.generate(prompt_tokens, max_tokens=4, temperature=0).tokens
    return where, {"llm": llm, "path": path, "vocab": llm.vocab, "prompt_tokens": prompt_tokens,
                   "tokens": prompt_tokens, "logits": logits, "generated": generated}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_block_runs(doc, prelude, monkeypatch, capsys):
    blocks = _blocks(doc)
    where, names = prelude
    monkeypatch.chdir(where)
    module = types.ModuleType(f"docs_{doc.stem}")   # a real module: dataclasses look their module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    namespace.update(names)
    skipped = []
    for line, source in blocks:
        if source.lstrip().startswith(NOT_RUN):
            skipped.append(line)
            continue
        try:
            exec(compile(source, f"{doc.name}:{line}", "exec"), namespace)
        except Exception as exc:
            pytest.fail(f"{doc.name}, the block at line {line} raised {type(exc).__name__}: {exc}")
    capsys.readouterr()
    assert len(skipped) < len(blocks), f"{doc.name}: every block is marked not run"


def test_a_not_run_block_says_why():
    for doc in DOCS:
        for line, source in _blocks(doc):
            first = source.lstrip().splitlines()[0] if source.strip() else ""
            if first.startswith(NOT_RUN):
                assert len(first) > len(NOT_RUN) + 5, f"{doc.name}:{line} is not run without a reason"
