"""Shared fixtures: tiny models written once per session; numba's cache warmed beside a whole-suite run."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.tiny_models import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """tiny_model_path(arch, weight_type="F32") -> path of a tiny GGUF model, written on first use."""
    root = tmp_path_factory.mktemp("tiny-models")

    def make(arch: str, weight_type: str = "F32"):
        path = root / f"{arch}-{weight_type}.gguf"
        if not path.exists():
            write_tiny_model(path, arch, weight_type)
        return path
    return make


@pytest.fixture(autouse=True)
def _unfreeze_the_heap():
    """The CLI commands, run in-process by tests, freeze the heap after loading (ggflow/process_heap.py): right
    for a process that loads one model, a leak in one that loads hundreds. Each test gives it back."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


# -- the other core compiles ahead (tests/prewarm_kernels.py) ------------------------------------------------
PREWARM_MIN_TESTS = 500     # a run this big is the whole suite, or most of it: worth warming for
_prewarm: list[subprocess.Popen] = []


def pytest_collection_finish(session):
    """Start tests/prewarm_kernels.py beside a large run (GGFLOW_TEST_PREWARM=0 turns it off)."""
    if len(session.items) < PREWARM_MIN_TESTS or os.environ.get("GGFLOW_TEST_PREWARM") == "0":
        return
    _prewarm.append(subprocess.Popen([sys.executable, "-m", "tests.prewarm_kernels"],
                                     cwd=Path(__file__).resolve().parents[1],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def pytest_sessionfinish(session, exitstatus):
    for proc in _prewarm:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
