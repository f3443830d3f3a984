"""Shared fixtures: tiny models written once per session."""
from __future__ import annotations

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
