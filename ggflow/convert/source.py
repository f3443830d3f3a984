"""A Hugging Face model directory as the converter reads it: config.json and tensors opened lazily.

Tensors are read one at a time, when the writer needs them, so the converter's peak memory is about one
tensor (plus its converted copy), not the model:

- ``safetensors`` (``safe_open``): reads one named tensor straight from the memory-mapped file; the format
  Hugging Face stores models in today.
- ``torch`` (``torch.load(mmap=True, weights_only=True)``): for the older ``pytorch_model*.bin`` pickles,
  which only torch can read; ``mmap`` keeps the storages on disk until a tensor is touched and
  ``weights_only`` refuses pickled code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ggflow.errors import ModelLoadError


@dataclass
class HFModel:
    path: Path
    config: dict[str, Any]
    _readers: dict[str, tuple[tuple[int, ...], Callable[[], np.ndarray]]]   # name -> (shape, read as float32)

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        return archs[0] if archs else ""

    def names(self) -> list[str]:
        return list(self._readers)

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 in Hugging Face's (PyTorch's) axis order."""
        return self._readers[name][1]()

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, from the file's header (nothing read)."""
        return self._readers[name][0]

    def file(self, name: str) -> Path | None:
        p = self.path / name
        return p if p.is_file() else None

    def json(self, name: str) -> dict[str, Any] | None:
        p = self.file(name)
        if p is None:
            return None
        with open(p, encoding="utf-8") as f:
            return json.load(f)


def open_hf_model(path: str | Path) -> HFModel:
    """Open a model directory; a ModelLoadError says what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a directory (give the Hugging Face model's folder)")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{path}: no config.json (not a Hugging Face model directory)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config_path}: unreadable ({exc})") from None
    readers = dict(_safetensors_readers(path))
    if not readers:
        readers = dict(_torch_readers(path))
    if not readers:
        raise ModelLoadError(f"{path}: no weights (*.safetensors or pytorch_model*.bin)")
    return HFModel(path, config, readers)


def _safetensors_readers(path: Path) -> Iterator[tuple[str, tuple]]:
    from safetensors import safe_open

    for file in sorted(path.glob("*.safetensors")):
        handle = safe_open(str(file), framework="pt")    # "pt": bf16 has no numpy dtype
        for name in handle.keys():
            shape = tuple(handle.get_slice(name).get_shape())
            yield name, (shape, lambda h=handle, n=name: _to_float32(h.get_tensor(n)))


def _torch_readers(path: Path) -> Iterator[tuple[str, tuple]]:
    files = sorted(path.glob("pytorch_model*.bin"))
    if not files:
        return
    import torch

    for file in files:
        state = torch.load(str(file), map_location="cpu", mmap=True, weights_only=True)
        for name, t in state.items():
            yield name, (tuple(t.shape), lambda t=t: _to_float32(t))


def _to_float32(t) -> np.ndarray:
    import torch

    return t.to(torch.float32).numpy()
