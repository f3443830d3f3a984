"""Importance weights for a quantization run, as llama-quantize takes them from ``--imatrix FILE``.

The file (GGUF or legacy .dat, ggflow.imatrix.files) is checked as llama.cpp checks it: a GGUF imatrix
needs its imatrix.* metadata, and every value must be finite. Each converted tensor then gets its entry's
mean squares (``Imatrix.importance``: sums / count per matrix), one weight per column, per expert for a
3-D tensor. An imatrix made for another model is refused, naming the first mismatch: an entry for a
tensor the model does not have, or an entry whose size is not the tensor's columns x experts (llama.cpp
lets token_embd's size differ: it then quantizes that tensor without weights). A tensor of a type that
needs importance weights (IQ1_*, IQ2_*, IQ3_XXS) without an entry is refused as llama-quantize refuses it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ggflow.errors import ImatrixError, QuantizationError
from ggflow.imatrix.files import Imatrix, read_imatrix
from ggflow.quantize_model.mixes import requires_imatrix
from ggflow.quantize_model.plan import Planned

# llama-quantize's kv_overrides with an imatrix, written after general.file_type in this order
KEY_FILE, KEY_DATASET = "quantize.imatrix.file", "quantize.imatrix.dataset"
KEY_N_ENTRIES, KEY_N_CHUNKS = "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"
_KV_MAX = 127   # llama_model_kv_override's val_str holds 127 characters


def load_imatrix(path: str | os.PathLike) -> tuple[Imatrix, str]:
    """The file read and checked; returns it and the path as llama-quantize records it."""
    m = read_imatrix(path)
    if not m.is_legacy and not m.has_metadata:
        raise ImatrixError(f"{path}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, "
                           "imatrix.chunk_size), which llama-quantize requires")
    for name, e in m.entries.items():
        if not np.isfinite(e.sums).all():
            raise ImatrixError(f"{path}: the imatrix contains non-finite values (entry {name})")
    return m, str(path)


@dataclass
class ImportanceWeights:
    """Per converted tensor, its importance weights (n_experts, n_cols) or None."""
    imatrix: Imatrix
    path: str
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)       # converted tensors the imatrix has no entry for

    def check(self, planned: list[Planned]) -> None:
        names = {p.desc.name for p in planned}
        for name in sorted(self.imatrix.entries):
            if name not in names:
                raise ImatrixError(f"{self.path}: the imatrix has an entry for {name!r}, which the model does not "
                                   "have: it was made for another model")
        for p in planned:
            if not p.converts or not p.out_traits.is_quantized:
                continue
            name, ne = p.desc.name, p.desc.ne
            w = self.imatrix.importance(name)
            n_expert = ne[2] if len(ne) > 2 else 1
            if w is None:
                if requires_imatrix(name, p.choice.type_name):
                    raise QuantizationError(f"Missing importance matrix for tensor {name} in a very low-bit "
                                            f"quantization ({p.choice.type_name}; llama-quantize refuses it too)")
                self.missing.append(name)
            elif w.size != ne[0] * n_expert:
                if name.startswith("token_embd."):
                    self.missing.append(name)
                    continue
                raise ImatrixError(f"{self.path}: imatrix size {w.size} is different from tensor size "
                                   f"{ne[0] * n_expert} for {name}: it was made for another model")
            else:
                self.weights[name] = w.reshape(n_expert, ne[0])

    def metadata(self) -> list[tuple[str, str | int]]:
        keys: list[tuple[str, str | int]] = [(KEY_FILE, self.path[:_KV_MAX])]
        if self.imatrix.datasets:
            keys.append((KEY_DATASET, self.imatrix.datasets[0][:_KV_MAX]))
        keys.append((KEY_N_ENTRIES, len(self.imatrix.entries)))
        if self.imatrix.chunk_count > 0:
            keys.append((KEY_N_CHUNKS, self.imatrix.chunk_count))
        return keys
