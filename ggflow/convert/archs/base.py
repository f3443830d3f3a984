"""What an architecture's converter provides, and the pieces they share."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

from ggflow.convert.source import HFModel
from ggflow.convert.writer import ConvertError, TensorPlan


class ArchConverter(ABC):
    hf_architectures: tuple[str, ...]   # config.json "architectures" values this converter takes
    gguf_arch: str                      # general.architecture it writes

    @abstractmethod
    def set_metadata(self, writer: Any, model: HFModel) -> None:
        """Hyperparameters and tokenizer fields, as llama.cpp's converter writes them."""

    @abstractmethod
    def tensors(self, model: HFModel) -> list[TensorPlan]:
        """The output tensors, in the order they are written, each read lazily from the model."""


def hparam(model: HFModel, *keys: str, default: Any = None) -> Any:
    """The first of keys config.json has (Hugging Face names one setting differently per family)."""
    for key in keys:
        if key in model.config:
            return model.config[key]
    if default is not None:
        return default
    raise ConvertError(f"{model.path}/config.json: none of {', '.join(keys)} is set")


def plan(model: HFModel, hf_name: str, name: str, transform: Callable[[np.ndarray], np.ndarray] | None = None,
         shape: tuple[int, ...] | None = None) -> TensorPlan:
    """An output tensor read from hf_name (transformed, when the layouts differ)."""
    read = (lambda: model.read(hf_name)) if transform is None else (lambda: transform(model.read(hf_name)))
    return TensorPlan(name, tuple(shape or model.shape(hf_name)), read)


def map_by_suffix(model: HFModel, names: dict[str, str], layer_map: dict[str, str], global_map: dict[str, str],
                  layer_prefix: str, skip: Callable[[str], bool] = lambda n: False) -> list[TensorPlan]:
    """Plans for every tensor: names maps a canonical name (prefixes stripped) to the file's; a canonical
    ``{layer_prefix}{il}.{suffix}`` -> ``blk.{il}.{layer_map[suffix]}``, others by global_map; a tensor
    neither maps (nor ``skip`` drops) is an error naming it."""
    plans = []
    for hf_name, source in names.items():
        if skip(hf_name):
            continue
        if hf_name.startswith(layer_prefix):
            il, _, suffix = hf_name[len(layer_prefix):].partition(".")
            if il.isdigit() and suffix in layer_map:
                plans.append(plan(model, source, f"blk.{il}.{layer_map[suffix]}"))
                continue
        elif hf_name in global_map:
            plans.append(plan(model, source, global_map[hf_name]))
            continue
        raise ConvertError(f"{model.path}: tensor {hf_name!r} has no GGUF name in this converter")
    return plans
