"""Model: a GGUF file opened as hyperparameters, memory-mapped weights and an architecture.

Weights are views into the memory map (no copy, no dequantization at load): each is a Tensor whose
buffer is one HostBuffer over the whole mapped file, at the tensor's data offset. A backend that copies a
weight (packs or uploads it) calls ``buffer.release``, and the file gives those pages back. The header is read
by ggflow.core.gguf_file (milliseconds, where gguf.GGUFReader takes seconds on a large vocabulary). The architecture is
looked up in the plugin registry by ``general.architecture``; it reads its hyperparameters and declares
its weights as a record (ggflow.core.weights), which the loader checks the file against and fills with
those views: a file that lacks a tensor, or has it misshapen, fails at load with its name and both shapes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ggflow.core.backend import HostBuffer
from ggflow.core.gguf_file import GGUFFile
from ggflow.core.hparams import HParams  # noqa: F401  (re-exported: older architectures import it from here)
from ggflow.core.metadata import Metadata  # noqa: F401  (re-exported: architectures import it from here)
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.core.weights import load_weights
from ggflow.errors import GGFlowError, ModelLoadError, UnknownNameError

if TYPE_CHECKING:
    from ggflow.core.arch import Architecture


class Model:
    def __init__(self, path: str, file: GGUFFile, arch: "Architecture", hparams: HParams,
                 weights: dict[str, Tensor], w: Any, buffer: HostBuffer | None):
        self.path, self.file, self.arch, self.hparams = path, file, arch, hparams
        self.weights = weights    # every tensor in the file, by name
        self.w = w                # the architecture's weight record: w.tok_embd, w.layers[il].wq, ...
        self.buffer = buffer
        self.metadata = Metadata(file.fields, path, file.types)
        self._vocab = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Model":
        from ggflow.plugins.manager import get_plugin_manager

        path = str(path)
        file = GGUFFile(path, lazy_arrays=True)   # the vocabulary's arrays: read when a tokenizer is built
        meta = Metadata(file.fields, path, file.types)
        if not meta.arch:
            raise ModelLoadError(f"{path}: general.architecture is missing")
        try:
            arch = get_plugin_manager().architectures.get(meta.arch)
        except UnknownNameError as exc:
            raise ModelLoadError(f"{path}: {exc}") from None
        hparams = arch.load_hparams(meta)
        buffer = HostBuffer(file.data(), "cpu", release=file.release, fileno=file.fileno)
        weights = _map_weights(file, buffer)
        w = load_weights(arch.weights, hparams, weights, path)
        return cls(path, file, arch, hparams, weights, w, buffer)

    @property
    def vocab(self):
        if self._vocab is None:
            from ggflow.core.vocab import Vocab
            self._vocab = Vocab(self.metadata, self.path)   # typed reads, errors naming the GGUF types
        return self._vocab

    @property
    def n_params(self) -> int:
        return sum(t.nelements for t in self.weights.values())

    @property
    def size_bytes(self) -> int:
        return sum(t.nbytes for t in self.weights.values())

    def __repr__(self) -> str:
        return f"Model({Path(self.path).name}: {self.metadata.arch}, {self.hparams.n_layer} layers)"


def _map_weights(file: GGUFFile, buffer: HostBuffer) -> dict[str, Tensor]:
    from ggflow.core.types import type_traits

    weights: dict[str, Tensor] = {}
    for info in file.tensors:
        try:
            traits = type_traits(info.type_id)
        except GGFlowError as exc:
            raise ModelLoadError(f"{file.path}: tensor {info.name!r} has a type no plugin provides: {exc}") from None
        try:
            t = Tensor(traits, info.ne or (1,), name=info.name, flags=TensorFlag.PARAM)
        except (ValueError, GGFlowError) as exc:
            raise ModelLoadError(f"{file.path}: tensor {info.name!r} of shape {list(info.ne)}: {exc}") from None
        if info.offset + t.nbytes > file.size:
            raise ModelLoadError(f"{file.path}: tensor {info.name!r} ends at byte {info.offset + t.nbytes} but "
                                 f"the file has {file.size} bytes (truncated?)")
        t.buffer, t.offset = buffer, info.offset
        weights[info.name] = t
    return weights
