"""The LoRA adapters of a Context, and each sequence's mix of them, applied per row inside one graph.

A Context holds a list of adapters (``LoraSet``) and, for every sequence id, the scale it gives each adapter.
The graph of a ubatch carries the adapters some token of it uses (the graph key includes them; a ubatch that
uses none gets the base model's graph unchanged) and, at every adapted product, adds each one's
``B (A x)`` times a per-token scale read from an input tensor: ``user_scale * alpha / rank`` for the token's
sequence, 0 for a sequence that does not use that adapter. So requests with different adapters decode in one
batch, each row with its own mix; a row's result is its solo run's bit for bit (adding ``d * 0`` to a finite
value changes nothing, and the products are batch-invariant row by row).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ggflow.core import ops
from ggflow.core.lora import TOKEN_EMBD, LoraAdapter, LoraPair
from ggflow.core.tensor import Tensor
from ggflow.errors import ArgumentError, ShapeError

if TYPE_CHECKING:
    from ggflow.core.batch import UBatch


class LoraSet:
    def __init__(self, adapters: Sequence[LoraAdapter], scales: Sequence[float], n_seq_max: int):
        if len(scales) != len(adapters):
            raise ArgumentError("scales", list(scales), f"one scale for each of the {len(adapters)} adapters")
        self.adapters = list(adapters)
        self.scales = check_scales(scales)   # the default mix (llama-server's global scales)
        # each sequence's mix: what its cached cells were computed with. Until the engine sets one, the default.
        self.seq_scales = np.tile(self.scales, (n_seq_max, 1))                     # [n_seq_max, n_adapters]
        self.by_weight: dict[str, list[tuple[int, LoraPair]]] = {}
        for i, adapter in enumerate(self.adapters):
            for name, pair in adapter.pairs.items():
                self.by_weight.setdefault(name, []).append((i, pair))

    def __len__(self) -> int:
        return len(self.adapters)

    def mix(self, scales: "dict[int, float] | None") -> np.ndarray:
        """A request's mix: ``{adapter id: scale}`` with the adapters it leaves out at 0 (llama-server's rule);
        None: the default mix."""
        if scales is None:
            return self.scales.copy()
        out = np.zeros(len(self.adapters), np.float32)
        for i, s in scales.items():
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.adapters):
                raise ArgumentError("lora id", i, f"an adapter id in [0, {len(self.adapters)})")
            out[i] = check_scales([s])[0]
        return out

    def set_sequence(self, seq_id: int, mix: np.ndarray) -> None:
        self.seq_scales[seq_id] = mix

    def active(self, seq_id: np.ndarray) -> tuple[int, ...]:
        """The adapters some token of the ubatch uses (a nonzero scale): part of the graph's key."""
        used = self.seq_scales[np.unique(seq_id)].any(axis=0)
        return tuple(int(i) for i in np.flatnonzero(used))

    def graph(self, active: tuple[int, ...], n_tokens: int, inp_out_ids: Tensor) -> "LoraGraph | None":
        return LoraGraph(self, active, n_tokens, inp_out_ids) if active else None

    def input_data(self, lg: "LoraGraph", ub: "UBatch") -> dict[Tensor, np.ndarray]:
        """Each scale input's per-token values for the ubatch's sequences."""
        return {t: self.adapters[i].scale(pair, self.seq_scales[ub.seq_id, i]).reshape(1, -1)
                for (i, rank), (t, pair) in lg.scale_inputs.items()}


def check_scales(scales: Sequence[float]) -> np.ndarray:
    out = []
    for s in scales:
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or not np.isfinite(s):
            raise ArgumentError("lora scale", s, "a finite number")
        out.append(float(s))
    return np.asarray(out, np.float32)


class LoraGraph:
    """The LoRA part of one graph: the active adapters' low-rank products at the weights they adapt."""

    def __init__(self, lora: LoraSet, active: tuple[int, ...], n_tokens: int, inp_out_ids: Tensor):
        self.lora, self.active, self.n_tokens, self.inp_out_ids = lora, set(active), n_tokens, inp_out_ids
        # (adapter, rank) -> (F32 [1, n_tokens] input of per-token scales, a pair of that rank)
        self.scale_inputs: dict[tuple[int, int], tuple[Tensor, LoraPair]] = {}
        self._out_scales: dict[Tensor, Tensor] = {}

    def _pairs(self, w: Tensor) -> list[tuple[int, LoraPair]]:
        return [(i, p) for i, p in self.lora.by_weight.get(w.name, ()) if i in self.active]

    def _scale(self, i: int, pair: LoraPair, n: int) -> Tensor:
        key = (i, pair.rank)
        if key not in self.scale_inputs:
            self.scale_inputs[key] = (ops.new_input("F32", (1, self.n_tokens), f"lora_scale_{i}_{pair.rank}"), pair)
        s = self.scale_inputs[key][0]
        if n == self.n_tokens:
            return s
        if n != self.inp_out_ids.ne[0]:
            raise ShapeError(f"LoRA on {pair.base!r}: a product over {n} rows, neither the ubatch's {self.n_tokens} "
                             f"tokens nor its {self.inp_out_ids.ne[0]} outputs (not supported)")
        if s not in self._out_scales:   # after select_outputs: the rows of the tokens whose outputs are wanted
            self._out_scales[s] = ops.get_rows(s, self.inp_out_ids)
        return self._out_scales[s]

    def apply(self, w: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """y = w x plus, for each active adapter of w, B (A x) times each token's scale. (A tied output reads
        token_embd, whose pair adapts the embedding lookup only, as peft's does.)"""
        if w.name == TOKEN_EMBD:
            return y
        pairs = self._pairs(w)
        if pairs and (x.ne[2] != 1 or x.ne[3] != 1):
            raise ShapeError(f"LoRA on {w.name!r}: the activations {list(x.ne)} are not a matrix (not supported)")
        for i, pair in pairs:
            delta = ops.mul_mat(pair.b, ops.mul_mat(pair.a, x))                  # [n_out, n]
            y = ops.add(y, ops.mul(delta, self._scale(i, pair, x.ne[1])))
        return y

    def apply_id(self, w: Tensor, x: Tensor, ids: Tensor, y: Tensor) -> Tensor:
        """y = the chosen experts of w times x (mul_mat_id) plus each active adapter's B_e (A_e x) for the same
        experts, times the token's scale. x [n_in, 1 or k, n], y [n_out, k, n]."""
        for i, pair in self._pairs(w):
            delta = ops.mul_mat_id(pair.b, ops.mul_mat_id(pair.a, x, ids), ids)  # [n_out, k, n]
            s = self._scale(i, pair, x.ne[2])
            y = ops.add(y, ops.mul(delta, ops.reshape(s, 1, 1, x.ne[2])))
        return y

    def apply_rows(self, w: Tensor, rows: Tensor, y: Tensor) -> Tensor:
        """y = rows of w (the token embeddings) plus each active adapter's B a[rows] times the scale."""
        if w.name != TOKEN_EMBD:
            return y
        for i, pair in self._pairs(w):
            delta = ops.mul_mat(pair.b, ops.get_rows(pair.a, rows))              # [n_embd, n_tokens]
            y = ops.add(y, ops.mul(delta, self._scale(i, pair, rows.ne[0])))
        return y
