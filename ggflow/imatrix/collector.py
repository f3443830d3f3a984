"""The importance-matrix collector: per weight matrix, the sum over tokens of each input column squared.

A scheduler observer (``Scheduler.observer``) with llama-imatrix's rules (tools/imatrix/imatrix.cpp,
``collect_imatrix``): every ``mul_mat_id`` (mixture-of-experts products) and every ``mul_mat`` whose
weight is a model tensor named ``blk.*`` (``output.weight`` too with ``process_output``), whose input
is F32 and holds at least 16 rows (smaller batches are skipped, as llama.cpp skips them). For a dense
product the sums are per column of each weight matrix (a 3-D weight's matrices one after another) with
one count, the input's rows per matrix; for experts, each token's row adds to the sums and the count of each expert it was routed
to. Sums accumulate in float32 in llama.cpp's order (row after row, element by element), in numba.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor
from ggflow.errors import GGFlowError

MIN_ROWS = 16   # llama-imatrix ignores products of fewer input rows


@dataclass
class Entry:
    """One weight's statistics: sums (n_mat, n_cols) float32 and counts (n_mat,) int64."""
    sums: np.ndarray
    counts: np.ndarray

    @property
    def n_mat(self) -> int:
        return self.sums.shape[0]


@njit(cache=True)
def _sum_squares(x, acc, n_mat2, n_mat3):   # pragma: no cover - numba
    """x (ne3, ne2, rows, cols) f32 into acc (n_mat, cols): matrix (i3 % n_mat3) * n_mat2 + (i2 % n_mat2)."""
    ne3, ne2, rows, cols = x.shape
    for i3 in range(ne3):
        for i2 in range(ne2):
            m = (i3 % n_mat3) * n_mat2 + (i2 % n_mat2)
            for r in range(rows):
                for j in range(cols):
                    v = x[i3, i2, r, j]
                    acc[m, j] += v * v


@njit(cache=True)
def _sum_squares_experts(x, ids, acc, counts):   # pragma: no cover - numba
    """x (tokens, ne11, cols) f32, ids (tokens, n_used) i32: slot k of token t adds row x[t, k % ne11] to
    expert ids[t, k]; slots outer, tokens inner, as llama.cpp's loop."""
    tokens, ne11, cols = x.shape
    for k in range(ids.shape[1]):
        for t in range(tokens):
            ex = ids[t, k]
            counts[ex] += 1
            for j in range(cols):
                v = x[t, k % ne11, j]
                acc[ex, j] += v * v


@dataclass
class Collector:
    """Scheduler observer accumulating ``entries`` (weight name -> Entry) over every compute it sees."""
    weight_names: frozenset[str]
    process_output: bool = False
    entries: dict[str, Entry] = field(default_factory=dict)

    def wants(self, node: Tensor) -> bool:
        if node.op == Op.MUL_MAT_ID:
            return node.src[0].name in self.weight_names
        if node.op != Op.MUL_MAT:
            return False
        name, x = node.src[0].name, node.src[1]
        if x.ne[1] < MIN_ROWS or x.type.name != "F32" or name not in self.weight_names:
            return False
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def observe(self, node: Tensor, sources: list[np.ndarray]) -> None:
        w, x = node.src[0], sources[0].reshape(node.src[1].ne[::-1])   # (ne3, ne2, ne1, ne0)
        if node.op == Op.MUL_MAT_ID:
            self._experts(w, x[0], sources[1].reshape(node.src[2].ne[1], node.src[2].ne[0]))
        else:
            self._dense(w, x)

    def _entry(self, name: str, n_counts: int, cols: int) -> Entry:
        e = self.entries.get(name)
        if e is None:
            e = self.entries[name] = Entry(np.zeros((n_counts, cols), np.float32), np.zeros(n_counts, np.int64))
        elif e.sums.shape != (n_counts, cols):
            raise GGFlowError(f"imatrix: inconsistent size for {name}: {e.sums.shape} then {(n_counts, cols)}")
        return e

    def _dense(self, w: Tensor, x: np.ndarray) -> None:
        n_mat2, n_mat3 = w.ne[2], w.ne[3]
        x = np.ascontiguousarray(x, np.float32)
        # one count for all of a dense weight's matrices, as llama.cpp keeps it: sums (1, n_mat * cols)
        e = self._entry(w.name, 1, n_mat2 * n_mat3 * x.shape[-1])
        _sum_squares(x, e.sums.reshape(n_mat2 * n_mat3, x.shape[-1]), n_mat2, n_mat3)
        _check_finite(w.name, e.sums)
        e.counts += x.shape[0] * x.shape[1] * x.shape[2] // (n_mat2 * n_mat3)

    def _experts(self, w: Tensor, x: np.ndarray, ids: np.ndarray) -> None:
        n_expert = w.ne[2]
        x = np.ascontiguousarray(x, np.float32)                  # (tokens, ne11, cols)
        ids = np.ascontiguousarray(ids, np.int32)                 # (tokens, n_used)
        if ids.shape[0] != x.shape[0]:
            raise GGFlowError(f"imatrix: {w.name}: {ids.shape[0]} tokens of expert ids for {x.shape[0]} rows")
        if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
            raise GGFlowError(f"imatrix: {w.name}: expert id outside [0, {n_expert})")
        e = self._entry(w.name, n_expert, x.shape[-1])
        _sum_squares_experts(x, ids, e.sums, e.counts)
        _check_finite(w.name, e.sums)


def _check_finite(name: str, sums: np.ndarray) -> None:
    if not np.isfinite(sums).all():
        raise GGFlowError(f"imatrix: non-finite values in the activations of {name} (llama-imatrix stops too)")
