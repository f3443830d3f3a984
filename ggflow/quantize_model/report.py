"""What a quantization run did: each tensor's input and output type, sizes, and a printable summary."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TensorResult:
    name: str
    ne: tuple[int, ...]
    in_type: str
    out_type: str
    action: str                # "copied", "converted" (from a float type) or "requantized" (from a quantized one)
    fallback_from: str | None  # the type the mix wanted, where the row length forced out_type instead
    in_bytes: int
    out_bytes: int
    weighted: bool | None = None   # with an imatrix: quantized with its importance weights (None: no imatrix)


@dataclass
class QuantizeReport:
    in_path: str
    out_path: str
    mix: str
    ftype: int | None  # None: no general.file_type was written (llama.cpp has none for the type)
    pure: bool
    tensors: list[TensorResult] = field(default_factory=list)
    in_size: int = 0   # file sizes in bytes
    out_size: int = 0
    seconds: float = 0.0
    imatrix: str | None = None   # the importance-matrix file used

    @property
    def type_counts(self) -> dict[str, int]:
        """Output type -> number of tensors, most frequent first."""
        return dict(Counter(t.out_type for t in self.tensors).most_common())

    @property
    def requantized(self) -> list[str]:
        """Tensors decoded from a quantized input type and quantized again (their errors add up)."""
        return [t.name for t in self.tensors if t.action == "requantized"]

    @property
    def fallbacks(self) -> list[TensorResult]:
        return [t for t in self.tensors if t.fallback_from]

    @property
    def n_elements(self) -> int:
        return sum(int(np.prod(t.ne)) for t in self.tensors)

    def summary(self) -> str:
        mib = 1024 * 1024
        weights_in = sum(t.in_bytes for t in self.tensors)
        weights_out = sum(t.out_bytes for t in self.tensors)
        n = max(self.n_elements, 1)
        lines = [
            f"{self.in_path} -> {self.out_path}: {self.mix}{' (pure)' if self.pure else ''}, "
            f"{'no general.file_type' if self.ftype is None else f'general.file_type {self.ftype}'}, "
            f"{self.seconds:.2f} s",
            f"  file size: {self.in_size / mib:.2f} MiB -> {self.out_size / mib:.2f} MiB",
            f"  weights:   {weights_in / mib:.2f} MiB ({weights_in * 8 / n:.2f} bits/weight) -> "
            f"{weights_out / mib:.2f} MiB ({weights_out * 8 / n:.2f} bits/weight)",
            f"  tensors:   {len(self.tensors)}: " + ", ".join(f"{k} {v}" for k, v in self.type_counts.items()),
        ]
        if self.fallbacks:
            lines.append(f"  fallback:  {len(self.fallbacks)} tensor(s) whose rows don't fit the mix's block got "
                         "another type: " + ", ".join(f"{t.name} {t.fallback_from}->{t.out_type}"
                                                      for t in self.fallbacks))
        if self.imatrix is not None:
            used = [t.name for t in self.tensors if t.weighted]
            unused = [f"{t.name} ({t.out_type})" for t in self.tensors if t.weighted is False]
            lines.append(f"  imatrix:   {self.imatrix}: importance weights used for {len(used)} tensor(s)")
            if unused:
                lines.append(f"  note: {len(unused)} tensor(s) quantized without importance weights (no entry in the "
                             "imatrix, or ggflow has no weighted encoder for the type yet, where llama.cpp "
                             "has one): " + ", ".join(unused))
        if self.requantized:
            lines.append(f"  note: {len(self.requantized)} tensor(s) were already quantized and were requantized "
                         "(decoded, then quantized again: the errors of both add up): " + ", ".join(self.requantized))
        return "\n".join(lines)
