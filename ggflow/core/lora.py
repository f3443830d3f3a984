"""A LoRA adapter as llama.cpp writes it (convert_lora_to_gguf.py), checked against the base model it adapts.

The file is a GGUF with ``general.type = "adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha`` and,
for each adapted weight ``W`` of the base model, a pair ``W.lora_a`` / ``W.lora_b`` (``W`` is the base
tensor's name, e.g. ``blk.0.attn_q.weight``). With W of ne [n_in, n_out]: lora_a is [n_in, rank] and lora_b
[rank, n_out], so the adapted product is ``W x + scale * B (A x)`` with ``scale = user_scale * alpha / rank``
(``user_scale`` when alpha is 0), as llama.cpp's build_lora_mm. A stack of experts [n_in, n_out, n_expert] has
a pair per expert, [n_in, rank, n_expert] and [rank, n_out, n_expert] (build_lora_mm_id). ``token_embd.weight``
(ne [n_embd, n_vocab]) is the exception: its lora_a is [rank, n_vocab] (rows picked by token id) and lora_b
[rank, n_embd].

Loading checks what llama.cpp checks (llama_adapter_lora_init_impl), and names what is wrong: the file's
types, its architecture against the model's, each tensor's suffix and pair, that the base model has the
tensor, and the shapes (the first mismatching tensor in file order, with both shapes: an adapter for another
model). The tensors stay views of the adapter file's memory map, as the model's weights do.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ggflow.core.backend import HostBuffer
from ggflow.core.gguf_file import GGUFFile
from ggflow.core.metadata import Metadata
from ggflow.core.tensor import Tensor
from ggflow.errors import AdapterError, GGFlowError

TOKEN_EMBD = "token_embd.weight"


@dataclass(frozen=True)
class LoraPair:
    base: str       # the adapted base weight's name
    a: Tensor       # [n_in, rank] ([rank, n_vocab] for token_embd)
    b: Tensor       # [rank, n_out] ([rank, n_embd] for token_embd)

    @property
    def rank(self) -> int:
        return int(self.b.ne[0])


class LoraAdapter:
    """The lora_a / lora_b pairs of one adapter file, by the base weight each adapts."""

    def __init__(self, path: str, alpha: float, pairs: dict[str, LoraPair], file: GGUFFile):
        self.path, self.alpha, self.pairs, self.file = path, alpha, pairs, file

    @property
    def tensors(self) -> dict[str, Tensor]:
        """Every lora tensor by its file name (what a backend adopts)."""
        return {f"{p.base}.lora_{ab}": t for p in self.pairs.values() for ab, t in (("a", p.a), ("b", p.b))}

    def scale(self, pair: LoraPair, user_scale: "float | np.ndarray") -> "np.float32 | np.ndarray":
        """llama.cpp's get_scale in float32: user_scale * alpha / rank, or user_scale when alpha is 0."""
        s = np.float32(user_scale) if np.isscalar(user_scale) else np.asarray(user_scale, np.float32)
        return s * np.float32(self.alpha) / np.float32(pair.rank) if self.alpha else s

    def __repr__(self) -> str:
        return f"LoraAdapter({os.path.basename(self.path)}: {len(self.pairs)} weights, alpha {self.alpha:g})"


def load_lora(path: "str | os.PathLike", model) -> LoraAdapter:
    """Read and check an adapter file for ``model`` (a ggflow.core.model.Model); AdapterError says what is wrong."""
    from ggflow.core.model import _map_weights

    path = os.fspath(path)
    try:
        file = GGUFFile(path)
        meta = Metadata(file.fields, path, file.types)
        _check_header(meta, model, path)
        alpha = meta.get_float("adapter.lora.alpha", 0.0)
        buffer = HostBuffer(file.data(), "cpu", release=file.release, fileno=file.fileno)
        tensors = _map_weights(file, buffer)
    except AdapterError:
        raise
    except GGFlowError as exc:   # unreadable, truncated, a bad field: the loaders' messages, as an adapter's
        raise AdapterError(f"LoRA adapter {exc}") from None
    pairs = _pairs(tensors, path)
    for name, pair in pairs.items():   # in file order: the first mismatch is named
        _check_shapes(pair, model.weights.get(name), path)
    return LoraAdapter(path, alpha, pairs, file)


def _check_header(meta: Metadata, model, path: str) -> None:
    general_type = meta.get_str("general.type", "")
    if general_type != "adapter":
        raise AdapterError(f"{path}: not a LoRA adapter: general.type is {general_type!r}, expected 'adapter' "
                           "(a model file, not an adapter made by convert_lora_to_gguf.py?)")
    adapter_type = meta.get_str("adapter.type", "")
    if adapter_type != "lora":
        raise AdapterError(f"{path}: adapter.type is {adapter_type!r}; only 'lora' adapters are supported")
    arch, base_arch = meta.get_str("general.architecture", ""), model.metadata.arch
    if arch != base_arch:
        raise AdapterError(f"{path}: the adapter is for architecture {arch!r}, the model is {base_arch!r}")


def _pairs(tensors: dict[str, Tensor], path: str) -> dict[str, LoraPair]:
    halves: dict[str, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        if name.endswith((".lora_a", ".lora_b")):
            halves.setdefault(name[:-7], {})[name[-1]] = t
        elif not name.endswith("_norm.weight"):   # llama.cpp skips norm vectors an adapter may carry
            raise AdapterError(f"{path}: tensor {name!r} is neither a .lora_a nor a .lora_b tensor")
    pairs = {}
    for base, ab in halves.items():
        missing = {"a", "b"} - set(ab)
        if missing:
            raise AdapterError(f"{path}: tensor {base!r} has a lora_{sorted(set(ab))[0]} but no "
                               f"lora_{missing.pop()}")
        pairs[base] = LoraPair(base, ab["a"], ab["b"])
    if not pairs:
        raise AdapterError(f"{path}: the adapter has no lora_a / lora_b tensors")
    return pairs


def _check_shapes(pair: LoraPair, w: Tensor | None, path: str) -> None:
    a, b, name = pair.a, pair.b, pair.base
    if w is None:
        raise AdapterError(f"{path}: tensor {name!r} does not exist in the base model (an adapter for another "
                           "model?)")
    shapes = (f"lora_a {list(a.ne[:a.n_dims])}, lora_b {list(b.ne[:b.n_dims])}, base "
              f"{list(w.ne[:max(w.n_dims, 2)])}")
    if w.n_dims > 3 or a.ne[2:] != w.ne[2:] or b.ne[2:] != w.ne[2:]:
        # a stack of experts [n_in, n_out, n_expert] has one pair per expert: [n_in, rank, n_expert], ...
        raise AdapterError(f"{path}: tensor {name!r} does not match the base model ({shapes}): an adapter for "
                           "another model?")
    if name == TOKEN_EMBD:
        ok = w.ne[0] == b.ne[1] and w.ne[1] == a.ne[1] and a.ne[0] == b.ne[0]
    else:
        ok = w.ne[0] == a.ne[0] and w.ne[1] == b.ne[1] and a.ne[1] == b.ne[0]
    if not ok:
        raise AdapterError(f"{path}: tensor {name!r} does not match the base model ({shapes}): an adapter for "
                           "another model?")
