"""Weight records: an architecture declares its weights once, as dataclasses whose fields name GGUF tensors.

``tensor(name, shape)`` declares a weight the file must have, ``optional(name, shape)`` one it may lack
(``None`` in the record), ``per_layer(Record)`` a list with one record per block, where ``{il}`` in a name
is the block's index. ``shape`` gives the expected ne (innermost first, as GGUF stores it) from the
hyperparameters. From that one declaration the loader both checks the file (naming the first tensor that
is missing or misshapen, with both shapes) and fills the record, as llama.cpp fills ``layers[il].wq``.
The record holds the file's own Tensors: views of the memory map, nothing copied.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from ggflow.errors import ModelLoadError
from ggflow.plugins.removed import removed_names

if TYPE_CHECKING:
    from ggflow.core.hparams import HParams
    from ggflow.core.tensor import Tensor

R = TypeVar("R")
Shape = Callable[["HParams"], tuple[int, ...]]

_TENSOR, _LAYERS = "ggflow.tensor", "ggflow.layers"


@dataclass(frozen=True)
class TensorSpec:
    name: str          # the GGUF tensor name; "{il}" stands for the block index
    shape: Shape       # hparams -> expected ne
    required: bool
    when: Callable[["HParams"], bool] | None = None   # looked up only where this holds (else None)


def tensor(name: str, shape: Shape, when: Callable[["HParams"], bool] | None = None) -> Any:
    """A field holding a weight the file must have; with ``when``, only a file whose hyperparameters satisfy
    it (a dense FFN where ``n_expert == 0``, the experts where not), and None in the record of the others."""
    return field(metadata={_TENSOR: TensorSpec(name, shape, True, when)})


def optional(name: str, shape: Shape, when: Callable[["HParams"], bool] | None = None) -> Any:
    """A field holding a weight some files have and some don't (a bias, rope_freqs); None when absent."""
    return field(default=None, metadata={_TENSOR: TensorSpec(name, shape, False, when)})


def per_layer(record: type) -> Any:
    """A field holding one ``record`` per block (hp.n_layer of them), its names formatted with {il}."""
    return field(metadata={_LAYERS: record})


def load_weights(record: type[R], hp: HParams, tensors: Mapping[str, Tensor], path: str) -> R:
    """Check ``tensors`` (the file's, by name) against the declaration and fill the record with them."""
    return _fill(record, hp, tensors, path, None)


def _fill(record: type[R], hp: HParams, tensors: Mapping[str, Tensor], path: str, il: int | None) -> R:
    if not is_dataclass(record):
        raise TypeError(f"{record!r} is not a dataclass of weights")
    values: dict[str, Any] = {}
    for f in fields(record):
        if _LAYERS in f.metadata:
            values[f.name] = [_fill(f.metadata[_LAYERS], hp, tensors, path, i) for i in range(hp.n_layer)]
        elif _TENSOR in f.metadata:
            values[f.name] = _lookup(f.metadata[_TENSOR], hp, tensors, path, il)
    return record(**values)


def _lookup(spec: TensorSpec, hp: HParams, tensors: Mapping[str, Tensor], path: str, il: int | None) -> Tensor | None:
    if spec.when is not None and not spec.when(hp):
        return None
    name, ne = spec.name.format(il=il), tuple(spec.shape(hp))
    t = tensors.get(name)
    if t is None:
        if spec.required:
            raise ModelLoadError(f"{path}: tensor {name!r} is missing (expected shape {list(ne)})")
        return None
    if t.ne[: len(ne)] != ne or any(n != 1 for n in t.ne[len(ne):]):
        raise ModelLoadError(f"{path}: tensor {name!r} has shape {list(t.ne[:t.n_dims])}, expected {list(ne)}")
    return t


__getattr__ = removed_names(__name__)   # a removed name says what replaced it
