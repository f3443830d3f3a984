"""Reading the input model and deciding what becomes of each tensor: copied as is, or converted to the
type the mix gives it (mixes.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from ggflow.core.gguf_file import GGUFFile
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import GGFlowError, ModelLoadError, QuantizationError
from ggflow.quantize_model.mixes import Mix, ModelFacts, TensorDesc, TypeChoice, choose_types
from ggflow.quantize_model.overrides import NO_OVERRIDES, TypeOverrides

# The per-architecture hyperparameters the mixes' rules read.
_FACT_KEYS = (".block_count", ".attention.head_count", ".attention.head_count_kv", ".expert_count")


def _fact_key(key: str) -> bool:
    return key == "general.architecture" or key.endswith(_FACT_KEYS)


@dataclass(frozen=True)
class Planned:
    """One input tensor and what becomes of it."""
    desc: TensorDesc
    offset: int                    # where its data starts in the input file
    in_bytes: int
    choice: TypeChoice
    in_traits: TypeTraits | None   # None for a type ggflow doesn't know (only copying it is possible)
    out_traits: TypeTraits | None

    @property
    def converts(self) -> bool:
        return self.choice.type_name != self.desc.type_name

    @property
    def n_rows(self) -> int:
        return n_rows(self.desc.ne)

    @property
    def out_bytes(self) -> int:
        if not self.converts:
            return self.in_bytes
        return self.out_traits.row_bytes(self.desc.ne[0]) * self.n_rows


def open_input(path: str) -> GGUFFile:
    """The input's header; a missing, truncated or malformed file is a ModelLoadError naming it.

    Only the keys the mixes' rules read are decoded: the rest is copied as the file stores it.
    """
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such model file")
    return GGUFFile(path, keep=_fact_key)


def model_facts(file: GGUFFile) -> ModelFacts:
    arch = file.get("general.architecture")
    if not arch:
        raise ModelLoadError(f"{file.path}: general.architecture is missing")
    n_layer = file.get(f"{arch}.block_count")
    if n_layer is None:
        raise ModelLoadError(f"{file.path}: required metadata key '{arch}.block_count' is missing")
    n_head = _first(file.get(f"{arch}.attention.head_count", 0))
    n_expert = int(file.get(f"{arch}.expert_count", 0) or 0)
    return ModelFacts(arch=str(arch), n_layer=int(n_layer), n_head=n_head,
                      n_head_kv=_first(file.get(f"{arch}.attention.head_count_kv", n_head)),
                      n_expert=n_expert if n_expert > 1 else 0)


def _first(value: Any) -> int:
    """Per-layer hparams may be arrays; the rules read layer 0's value, as llama.cpp's n_gqa() does."""
    flat = np.ravel(value)
    return int(flat[0]) if flat.size else 0


def plan(file: GGUFFile, mix: Mix, facts: ModelFacts, pure: bool,
         overrides: TypeOverrides = NO_OVERRIDES, has_imatrix: bool = False) -> list[Planned]:
    descs, spans = [], []
    for t in file.tensors:
        type_name = _type_name(file, t.name, t.type_id)
        descs.append(TensorDesc(t.name, t.ne, type_name))
        spans.append((t.offset, _n_bytes(file, t.name, t.ne, type_name)))
    choices = choose_types(descs, mix, facts, pure, overrides, has_imatrix)
    out = []
    for desc, (offset, n_bytes) in zip(descs, spans):
        choice = choices[desc.name]
        in_traits = _known_type(desc.type_name)
        out_traits = _known_type(choice.type_name)
        if choice.type_name != desc.type_name and (in_traits is None or in_traits.to_float is None):
            raise QuantizationError(f"tensor {desc.name!r} is {desc.type_name}, which ggflow cannot decode, "
                                    f"so it cannot become {choice.type_name}")
        out.append(Planned(desc, offset, n_bytes, choice, in_traits, out_traits))
    _check_in_file(file, out)
    return out


def _type_name(file: GGUFFile, name: str, type_id: int) -> str:
    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        raise ModelLoadError(f"{file.path}: tensor {name!r} has type id {type_id}, which is no ggml type "
                             "that gguf knows") from None


def _n_bytes(file: GGUFFile, name: str, ne: tuple[int, ...], type_name: str) -> int:
    """The tensor's size from ggml's block sizes (gguf's table: it knows types ggflow can only copy)."""
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    if ne[0] % block:
        raise ModelLoadError(f"{file.path}: tensor {name!r} has rows of {ne[0]} elements, not a multiple of "
                             f"{type_name}'s block of {block}")
    return ne[0] // block * type_size * n_rows(ne)


def _check_in_file(file: GGUFFile, planned: list[Planned]) -> None:
    """Every tensor's data lies inside the file (a truncated download is caught before any work)."""
    for p in planned:
        if p.offset + p.in_bytes > file.size:
            raise ModelLoadError(f"{file.path}: tensor {p.desc.name!r} ends at byte {p.offset + p.in_bytes} "
                                 f"but the file has {file.size} bytes (truncated?)")


def _known_type(name: str) -> TypeTraits | None:
    try:
        return type_traits(name)
    except GGFlowError:
        return None


def n_rows(ne: tuple[int, ...]) -> int:
    return int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
