"""mul_mat_id: each token's rows times the matrices of the experts its router chose (mixture of experts).

ggml_mul_mat_id(as [k, m, n_expert], b [k, n_b, n_tokens], ids I32 [n_used, n_tokens]) -> out [m, n_used,
n_tokens], out[:, e, t] = as[:, :, ids[e, t]] @ b[:, e % n_b, t].

The (token, slot) pairs are sorted by expert, their activation rows gathered into one contiguous array in
that order, and each expert that some token chose multiplies its run of rows in one product: an expert's
weights are read once per call (once per ubatch) and an expert nobody chose is not read at all, so a decode
step reads n_used / n_expert of the layer's expert bytes. Each product is the packed-weight kernel of
quant_matmul (every quant type it runs, a plugin type with CPU pieces too), one Python call per used
expert, never per row; each expert's matrix is packed on its own (PackedWeights packs a weight's
matrices one by one). The gathered rows are quantized to the weights' vec_dot_type once for all experts
(a row's quantization does not depend on its neighbours), so a decode step's products cost about what one
dense product of the same active rows costs. A row's result is what mul_mat gives that row against that
expert: the kernels' results do not depend on how many rows come with it.

A weight the packed kernels don't take (memory off the host, no quant_matmul) is decoded per used expert
with its to_float and multiplied by numpy, the activations first rounded to its vec_dot_type as ggml does.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import numba
import numpy as np

from ggflow.backends_builtin.cpu.arrays import F32, TensorArrays, to_f32
from ggflow.backends_builtin.cpu.products.matmul import PackedWeights, vec_dot_rounding
from ggflow.core.tensor import Tensor
from ggflow.errors import BackendError

Kernel = Callable[[], None]
# (experts, run starts, run ends, x (pairs, k), y (pairs, m)): y[s:e] = x[s:e] @ that expert's matrix^T
Products = Callable[[list, list, list, np.ndarray, np.ndarray], None]


def bind_mul_mat_id(node: Tensor, arrays: TensorArrays, weights: PackedWeights,
                    n_threads: int | None = None) -> Kernel:
    as_, b, ids = node.src
    n_expert, n_used, n_b = as_.ne[2], ids.ne[0], b.ne[1]
    b_view = arrays.view(b)[0]                      # (n_tokens, n_b, k)
    ids_view = arrays.view(ids)[0, 0]               # (n_tokens, n_used)
    out = arrays.view(node)[0]                      # (n_tokens, n_used, m)
    product = _expert_product(as_, arrays, weights, n_threads)

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
        product(experts[starts].tolist(), starts.tolist(), ends.tolist(), x, y)   # one product per expert chosen
        out[token, slot] = y
    return run


def _expert_product(as_: Tensor, arrays: TensorArrays, weights: PackedWeights, n_threads: int | None) -> Products:
    """y[s:e] = x[s:e] @ expert's matrix^T for each (expert, s, e): the packed kernels where the weight is
    packed, else numpy on its floats."""
    packs = weights.get(as_) if as_ not in arrays.substitutes and as_.ne[3] == 1 else None
    if packs is not None:
        matrices, kernels = packs[0], weights.kernels          # packs[i3][i2]: one per expert
        if matrices[0].vec_dot_type is not None:
            return partial(_quantized_products, matrices, kernels, n_threads)

        def float_products(experts, starts, ends, x, y) -> None:
            for e, s, t in zip(experts, starts, ends):
                kernels.mul_mat(matrices[e], x[s:t], y[s:t])
        return float_products

    a_view = arrays.view(as_)[0]                                # (n_expert, m, k or row bytes)
    round_x = vec_dot_rounding(as_.type, as_.ne[0])

    def decoded(experts, starts, ends, x, y) -> None:
        x = round_x(x)
        for e, s, t in zip(experts, starts, ends):
            np.matmul(x[s:t], to_f32(a_view[e], as_.type).T, out=y[s:t])
    return decoded


def _quantized_products(matrices: list, kernels, n_threads: int | None, experts: list[int], starts: list[int],
                        ends: list[int], x: np.ndarray, y: np.ndarray) -> None:
    """The activations quantized once for every pair (a row's quantization does not depend on the rows beside
    it), then each expert's kernel over its run of rows: what quant_matmul.mul_mat does per expert, without
    quantizing and choosing again each time."""
    first = matrices[experts[0]]
    xq, dx, xe = kernels.quantize_activations(x, first.vec_dot_type)
    threads = numba.get_num_threads() if n_threads is None else n_threads
    for e, s, t in zip(experts, starts, ends):
        pw = matrices[e]
        parallel = kernels.use_parallel((t - s) * pw.rows * pw.k, threads)
        pw.kernel(parallel, t - s)(pw.kind, pw.arrays, xq[s:t], dx[s:t], xe[s:t], y[s:t])
