"""transformers on PyTorch (CPU, fp32) as the independent reference: it loads the same GGUF file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def hf_logits(path: Path, token_ids: list[int]) -> np.ndarray:
    """Logits [n_tokens, n_vocab] of transformers running the GGUF file at path on token_ids in one batch."""
    torch = pytest.importorskip("torch", reason="torch (the reference) is not installed: pip install torch==2.13.0")
    transformers = pytest.importorskip("transformers", reason="transformers (the reference) is not installed")
    transformers.logging.set_verbosity_error()
    model = _load(transformers, torch, path)
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


_cache: dict[Path, object] = {}


def _load(transformers, torch, path: Path):
    if path not in _cache:
        _cache.clear()  # keep one model in memory at a time
        _cache[path] = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return _cache[path]
