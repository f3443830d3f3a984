"""mul_mat_id: each token's rows times the matrices of the experts its router chose (mixture of experts).

ggml_mul_mat_id(as [k, m, n_expert], b [k, n_b, n_tokens], ids I32 [n_used, n_tokens]) -> out [m, n_used,
n_tokens], out[:, e, t] = as[:, :, ids[e, t]] @ b[:, e % n_b, t].

The (token, slot) pairs are sorted by expert, their activation rows gathered into one contiguous array in
that order, and each expert that some token chose multiplies its run of rows in one product: an expert's
weights are read once per call (once per ubatch) and an expert nobody chose is not read at all, so a decode
step reads n_used / n_expert of the layer's expert bytes. Each product is the packed-weight kernel of
quant_matmul (every quant type it runs, a plugin type with CPU pieces too), one Python call per used
expert, never per row; each expert's matrix is packed on its own (PackedWeights packs a weight's
matrices one by one). A row's result is what mul_mat gives that row against that expert: the kernels'
results do not depend on how many rows come with it.

A weight the packed kernels don't take (memory off the host, no quant_matmul) is decoded per used expert
with its to_float and multiplied by numpy, the activations first rounded to its vec_dot_type as ggml does.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggflow.backends_builtin.cpu.arrays import F32, TensorArrays, to_f32
from ggflow.backends_builtin.cpu.kernels_matmul import PackedWeights, vec_dot_rounding
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError

Kernel = Callable[[], None]
Product = Callable[[int, np.ndarray, np.ndarray], None]   # (expert, x (n, k), out (n, m))


def bind_mul_mat_id(node: Tensor, arrays: TensorArrays, weights: PackedWeights,
                    n_threads: int | None = None) -> Kernel:
    as_, b, ids = node.src
    n_expert, n_used, n_b = as_.ne[2], ids.ne[0], b.ne[1]
    b_view = arrays.view(b)[0]                      # (n_tokens, n_b, k)
    ids_view = arrays.view(ids)[0, 0]               # (n_tokens, n_used)
    out = arrays.view(node)[0]                      # (n_tokens, n_used, m)
    product = _expert_product(as_, arrays, weights)

    def run() -> None:
        chosen = np.ascontiguousarray(ids_view).ravel()          # pair p = token p // n_used, slot p % n_used
        if chosen.size == 0:
            return
        if chosen.min() < 0 or chosen.max() >= n_expert:
            raise BackendError(f"mul_mat_id: expert ids must lie in 0..{n_expert - 1}, got "
                               f"{int(chosen.min())}..{int(chosen.max())} (node {node!r})")
        order = np.argsort(chosen, kind="stable")                 # pairs grouped by expert
        experts = chosen[order]
        starts = np.flatnonzero(np.concatenate(([True], experts[1:] != experts[:-1])))
        ends = np.append(starts[1:], experts.size)
        token, slot = np.divmod(order, n_used)
        x = np.ascontiguousarray(to_f32(b_view, b.type)[token, slot % n_b], dtype=F32)   # (pairs, k)
        y = np.empty((x.shape[0], out.shape[-1]), F32)                                     # (pairs, m)
        for start, end in zip(starts.tolist(), ends.tolist()):    # one product per expert chosen
            product(int(experts[start]), x[start:end], y[start:end])
        out[token, slot] = y
    return run


def _expert_product(as_: Tensor, arrays: TensorArrays, weights: PackedWeights) -> Product:
    """out = x @ expert e's matrix^T: the packed kernel where the weight is packed, else numpy on its floats."""
    packs = weights.get(as_) if as_ not in arrays.substitutes and as_.ne[3] == 1 else None
    if packs is not None:
        matrices, kernels = packs[0], weights.kernels          # packs[i3][i2]: one per expert

        def packed(e: int, x: np.ndarray, y: np.ndarray) -> None:
            kernels.mul_mat(matrices[e], x, y)
        return packed

    a_view = arrays.view(as_)[0]                                # (n_expert, m, k or row bytes)
    round_x = vec_dot_rounding(as_.type, as_.ne[0])

    def decoded(e: int, x: np.ndarray, y: np.ndarray) -> None:
        np.matmul(round_x(x), to_f32(a_view[e], as_.type).T, out=y)
    return decoded
