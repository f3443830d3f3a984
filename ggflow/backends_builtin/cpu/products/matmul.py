"""mul_mat: packed-weight kernels for the weight types quant_matmul knows, a generic path for the rest.

ggml_mul_mat(a [k, m, A2, A3], b [k, n, B2, B3]) -> out [m, n, B2, B3], out[i3, i2, j, i] = dot(a row i,
b row j). a's matrices broadcast over b's in blocks: b matrix i2 uses a matrix i2 // (B2 / A2) (so several
query heads share one K/V head, GQA), and the same for dim 3.

Fast path: a weight (a leaf tensor, contiguous, of a type quant_matmul.has_kernel takes: the float types,
every built-in quant type, a plugin type with CPU pieces, and one without, converted once to a float type)
is packed once (``PackedWeights``, filled by the backend's prepare_weight hook or on first compile) and
multiplied by quant_matmul.mul_mat. A leaf multiplied directly is taken to be constant between computes; state that
changes (the KV cache) is read through views, which take the generic path.

Generic path: any type, any strides, and every output row the same whatever the number of rows (tokens) in
the call (batch invariance: a prompt's last token re-evaluated alone after a KV-prefix reuse must give the
logits it gave in the prompt's batch). Like ggml, b is first rounded to a's vec_dot_type (F16 for F16,
Q8_0/Q8_K/... for quantized a), so an F16 K cache times F32 queries gives what ggml's F16 x F16 dot gives, up
to summation order.
- a weight the fast path does not take (a type that cannot be decoded ahead, memory not on the host): a
  turned into float32 on each run (through its to_float), numpy's matmul (BLAS) over chunks of
  ROWS_PER_GEMM rows.
- anything else (the K and V views of the cache in attention): products.fixed_order's kernel, which
  reads F32 and F16 where they lie and adds each output's products in one fixed order (other types are
  converted to float32 first).
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ggflow.backends_builtin.cpu.products import fixed_order
from ggflow.backends_builtin.cpu import thread_choice
from ggflow.backends_builtin.cpu.arrays import F32, TensorArrays, from_f32, to_f32
from ggflow.core.ops import Op
from ggflow.core.tensor import Tensor, TensorFlag
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import UnknownNameError

Kernel = Callable[[], None]
# The generic path multiplies a weight by exactly this many activation rows per BLAS call (the last
# chunk zero-padded). BLAS picks its kernel, and so its summation order, by the shape of the call: with
# one shape for every call, a row's result does not depend on how many rows came with it, so decoding
# token by token gives what one batch gives, as in ggml. That matters where activations are quantized
# next (Q8_0 before a quantized matmul): a last-bit difference can flip a rounding and move logits by
# 1e-2. Attention does not take this path: padding a decode step's single query row to 16 would multiply
# its work by 16 (products.fixed_order has a fixed summation order instead).
ROWS_PER_GEMM = 16
QUANT_MATMUL_MODULE = "ggflow.backends_builtin.cpu.products.quant_matmul"


def load_quant_matmul() -> ModuleType | None:
    """The packed-weight kernels, or None when that module is not installed (the generic path runs all)."""
    if importlib.util.find_spec(QUANT_MATMUL_MODULE) is None:
        return None
    return importlib.import_module(QUANT_MATMUL_MODULE)  # a broken module should fail loudly, not be skipped


# -- fast path: packed weights ---------------------------------------------------------------------
class PackedWeights:
    """Weights packed for quant_matmul, one pack per 2-D matrix, cached per tensor.

    A weight packed into a copy (the quantized types) gives its memory-mapped pages back
    (``Buffer.release``): the kernels never read them again, and the process would otherwise hold the
    file and its packed copy both. F32/F16/BF16 packs are the mapped bytes themselves and keep them.
    """

    def __init__(self, kernels: ModuleType | None):
        self.kernels = kernels
        self._packs: dict[Tensor, tuple[int, list[list[Any]]]] = {}  # tensor -> (data address, packs[i3][i2])

    def is_eligible(self, t: Tensor) -> bool:
        return (self.kernels is not None and self.kernels.has_kernel(t.type.name) and is_weight(t)
                and t.is_contiguous() and t.buffer is not None and t.buffer.is_host)

    def get(self, t: Tensor) -> list[list[Any]] | None:
        """The packs of a weight (packing it now if it is new or its memory moved); None if not eligible."""
        if not self.is_eligible(t):
            return None
        w = t.numpy()                                      # (A3, A2, m, k) or (A3, A2, m, row bytes)
        address = w.ctypes.data
        cached = self._packs.get(t)
        if cached is None or cached[0] != address:
            packs = [[self.kernels.pack_weight(w[i3, i2], t.type.name, _release_rows(t, w, w[i3, i2]))
                      for i2 in range(w.shape[1])] for i3 in range(w.shape[0])]
            cached = self._packs[t] = (address, packs)
            if not any(np.may_share_memory(a, w) for row in packs for pack in row for a in pack.arrays):
                t.buffer.release(t.offset, t.nbytes)   # packed into a copy: the file's pages can go
        return cached[1]

    def __len__(self) -> int:
        return len(self._packs)


def _release_rows(t: Tensor, w: np.ndarray, matrix: np.ndarray) -> Callable[[int, int], object]:
    """For pack_weight: give back the pages of the rows of ``matrix`` (one 2-D matrix of ``w``, the weight's
    array) as they are packed into a copy. Each call releases all rows packed so far, so a page two runs share
    goes with the second; pages already given back cost nothing to advise again."""
    start = t.offset + (matrix.ctypes.data - w.ctypes.data)
    row_bytes = matrix.strides[0]
    return lambda r0, r1: t.buffer.release(start, r1 * row_bytes)


def bind_mul_mat(node: Tensor, arrays: TensorArrays, weights: PackedWeights, n_threads: int | None = None,
                 masked: Mapping[Tensor, tuple[Tensor, int]] | None = None,
                 written: Collection[Tensor] = ()) -> Kernel:
    """n_threads: the threads the plan runs on (None: numba's count), for the packed kernels' choice;
    masked: the attention products that may skip the pages their tokens cannot see (ops/attention_pages.py);
    written: the tensors an in-place op of the plan writes into (set_rows, cpy into a view): a product
    whose activations lie there quantizes them for itself, not once for all their products."""
    a, b = node.src
    packs = weights.get(a) if a not in arrays.substitutes else None
    if packs is not None:
        return _bind_packed(packs, weights.kernels, node, arrays, n_threads, shared_x=b.base() not in written)
    return _bind_generic(node, arrays, (masked or {}).get(node))


def bind_product_group(steps: Sequence[Tensor], i: int, arrays: TensorArrays, weights: PackedWeights,
                       n_threads: int | None = None, written: Collection[Tensor] = ()) -> tuple[Kernel, int] | None:
    """Products that follow one another in the plan from steps[i] with one activation and weights of one
    quantized kind (a layer's q, k and v; up and gate) as one kernel (quant_matmul.bind_mul_mats: one call, one
    parallel region, the same bits), and how many steps it runs; None where fewer than two such products start
    there. Arguments as bind_mul_mat's."""
    if weights.kernels is None or steps[i].op != Op.MUL_MAT:
        return None
    b = steps[i].src[1]
    group = []                                    # (node, its weight's pack)
    for node in steps[i:i + weights.kernels.MAX_GROUP_WEIGHTS]:
        a = node.src[0] if node.op == Op.MUL_MAT and node.src[1] is b else None
        packs = weights.get(a) if a is not None and a not in arrays.substitutes and a.ne[2] == a.ne[3] == 1 else None
        if packs is None:
            break
        group.append((node, packs[0][0]))
    while len(group) > 1 and not weights.kernels.can_group([pack for _, pack in group]):
        group.pop()                               # the products of the first's kind (a Q4_K q and k, a Q6_K v)
    nodes = [node for node, _ in group]
    if len(nodes) < 2 or b.type.name != "F32":
        return None
    x_view = arrays.view(b)
    if not x_view.flags.c_contiguous:
        return None
    outs = [arrays.view(node).reshape(-1, node.ne[0]) for node in nodes]
    if any(np.may_share_memory(out, other) for j, out in enumerate(outs) for other in (x_view, *outs[:j])):
        return None
    kernel = weights.kernels.bind_mul_mats([pack for _, pack in group], x_view.reshape(-1, b.ne[0]), outs, n_threads,
                                           arrays.shared, x_source=b if b.base() not in written else None)
    return kernel, len(nodes)


def _bind_packed(packs: list[list[Any]], kernels: ModuleType, node: Tensor, arrays: TensorArrays,
                 n_threads: int | None, shared_x: bool = False) -> Kernel:
    a, b = node.src
    x_view, out = arrays.view(b), arrays.view(node)        # (B3, B2, n, k), (B3, B2, n, m)
    k, m = a.ne[0], a.ne[1]

    def load_x() -> np.ndarray:
        return np.ascontiguousarray(to_f32(x_view, b.type), dtype=F32)

    if a.ne[2] == a.ne[3] == 1:
        pack, out_rows = packs[0][0], out.reshape(-1, m)    # node results are contiguous: a view
        if b.type.name == "F32" and x_view.flags.c_contiguous:   # x read where it lies: bound once
            return kernels.bind_mul_mat(pack, x_view.reshape(-1, k), out_rows, n_threads, arrays.shared,
                                        x_source=b if shared_x else None)
        return lambda: kernels.mul_mat(pack, load_x().reshape(-1, k), out_rows)

    r3, r2 = b.ne[3] // a.ne[3], b.ne[2] // a.ne[2]
    batches = [(packs[i3 // r3][i2 // r2], i3, i2) for i3 in range(b.ne[3]) for i2 in range(b.ne[2])]

    def run_batched() -> None:  # a Python step per matrix (not per row): a stack of weights is rare
        x = load_x()
        for pack, i3, i2 in batches:
            kernels.mul_mat(pack, x[i3, i2], out[i3, i2])
    return run_batched


# -- generic path ----------------------------------------------------------------------------------
def _bind_generic(node: Tensor, arrays: TensorArrays, masked: tuple[Tensor, int] | None = None) -> Kernel:
    a = node.src[0]
    return _bind_weight_gemm(node, arrays) if is_weight(a) else _bind_fixed_order(node, arrays, masked)


def _bind_weight_gemm(node: Tensor, arrays: TensorArrays) -> Kernel:
    """A weight of a type with no packed kernel: BLAS over chunks of exactly ROWS_PER_GEMM rows."""
    a, b = node.src
    a_view, b_view, out = arrays.view(a), arrays.view(b), arrays.view(node)
    a3, a2, (k, m, n) = a.ne[3], a.ne[2], (a.ne[0], a.ne[1], b.ne[1])
    rows = ROWS_PER_GEMM
    n_padded = -(-n // rows) * rows
    round_x = vec_dot_rounding(a.type, k)

    def weights_t() -> np.ndarray:
        w = blas_ready(to_f32(a_view, a.type))                          # (A3, A2, m, k)
        return np.swapaxes(w[:, None, :, None, None], -1, -2)           # (A3, 1, A2, 1, 1, k, m)

    if n_padded == n:
        out_chunks = row_chunks(out, a3, a2, rows)                      # (A3, r3, A2, r2, c, R, m)

        def run() -> None:
            x = blas_ready(round_x(to_f32(b_view, b.type)))             # (B3, B2, n, k)
            np.matmul(row_chunks(x, a3, a2, rows), weights_t(), out=out_chunks)
        return run

    x_padded = np.zeros((b.ne[3], b.ne[2], n_padded, k), dtype=F32)    # rows from n on stay 0
    out_padded = np.empty((b.ne[3], b.ne[2], n_padded, m), dtype=F32)
    x_chunks, out_chunks = row_chunks(x_padded, a3, a2, rows), row_chunks(out_padded, a3, a2, rows)

    def run_padded() -> None:
        x_padded[:, :, :n] = round_x(to_f32(b_view, b.type))
        np.matmul(x_chunks, weights_t(), out=out_chunks)
        out[...] = out_padded[:, :, :n]
    return run_padded


def _bind_fixed_order(node: Tensor, arrays: TensorArrays, masked: tuple[Tensor, int] | None = None) -> Kernel:
    """State that changes between computes (K and V views of the cache): products.fixed_order's kernel.

    F32 and F16 operands are read where they lie (the views are bound once; their contents change);
    other types are converted to float32 on each run, x rounded to a's vec_dot_type (Q8_0, ...) here.
    masked: (mask, skip) where the product may skip the cache pages its tokens cannot see.
    """
    a, b = node.src
    a_view, b_view, out = arrays.view(a), arrays.view(b), arrays.view(node)
    k, m, n_rows = a.ne[0], a.ne[1], b.ne[1] * b.ne[2] * b.ne[3]
    a_shape = (a.ne[3], a.ne[2], m, k)                              # a_view's rows are bytes if quantized
    kernel = fixed_order.mul_mat_fixed_order_serial
    if n_rows * m * k >= fixed_order.PARALLEL_MIN_MACS:   # parallel or serial, whichever is faster now
        kernel = thread_choice.adaptive(("fixed order", a_shape, b_view.shape), fixed_order.mul_mat_fixed_order_parallel, kernel)
    tasks = fixed_order.n_tasks(a_shape, b_view.shape)
    a_native, x_native = native_operand(a_view, a.type), native_operand(b_view, b.type)
    a_memory = fixed_order.as_memory(a_native) if a_native is not None else None
    a_f32 = arrays.f32_reader(a) if a_native is None else None   # e.g. V of a quantized cache
    round_x = vec_dot_rounding(a.type, k)
    x_in_place = x_native is not None and a.type.vec_dot_type in ("F32", "F16")
    round_x_to_f16 = x_in_place and a.type.vec_dot_type == "F16"
    # x and out always C-contiguous: numba compiles a kernel once per argument layout, and a strided x (q,
    # permuted, in a prompt) next to a contiguous one (softmax rows, a decode step's q) compiled each
    # driver twice, some 8 s per compile; copying q costs microseconds.
    target = out if out.dtype == F32 and out.flags.c_contiguous else np.empty(out.shape, F32)

    live, skip, refresh = pages_seen(node, arrays, masked)

    def run() -> None:
        if refresh is not None:
            refresh()
        a_data, a_step = a_memory if a_memory is not None else fixed_order.as_memory(a_f32())
        x = x_native if x_in_place else round_x(to_f32(b_view, b.type))
        kernel(a_data, a_shape, a_step, np.ascontiguousarray(x), target, round_x_to_f16, live, skip, 0, tasks)
        if target is not out:
            out[...] = target
    return run


def pages_seen(node: Tensor, arrays: TensorArrays, masked: tuple[Tensor, int] | None
                ) -> tuple[np.ndarray, int, Callable[[], None] | None]:
    """(live, skip, refresh) for the fixed-order kernel: which cache pages each token sees, read from the
    mask; refresh, for the first product of the plan that reads this mask, recomputes live from it (the
    plan's later products share the array: one pass over the mask per run, not one per layer)."""
    if masked is None:
        return fixed_order.NO_PAGES, fixed_order.NO_SKIP, None
    mask, skip = masked
    a, b = node.src
    n_kv = a.ne[1] if skip == fixed_order.SKIP_COLUMNS else a.ne[0]
    n_tokens = b.ne[1]
    if n_kv % fixed_order.PAGE or mask.ne[0] != n_kv or mask.ne[1] < n_tokens or mask.ne[2:] != (1, 1):
        return fixed_order.NO_PAGES, fixed_order.NO_SKIP, None
    key = ("pages seen", mask.id, n_tokens)
    shared = arrays.shared.get(key)
    if shared is not None:
        return shared, skip, None
    live = arrays.shared[key] = np.ones((n_tokens, n_kv // fixed_order.PAGE), np.uint8)
    mask_rows = arrays.view(mask)[0, 0, :n_tokens]
    return live, skip, lambda: fixed_order.pages_live(mask_rows, live)


def native_operand(view: np.ndarray, traits: TypeTraits) -> np.ndarray | None:
    """What the fixed-order kernel reads in place: F32 as is, F16 as its bits; None for other types."""
    if traits.name == "F32":
        return view
    if traits.name == "F16":
        return view.view(np.uint16)
    return None


def is_weight(t: Tensor) -> bool:
    return t.is_leaf and t.view_src is None and not t.flags & TensorFlag.INPUT


def row_chunks(x: np.ndarray, a3: int, a2: int, rows: int) -> np.ndarray:
    """(B3, B2, n, c) -> (A3, B3/A3, A2, B2/A2, n/rows, rows, c), a view.

    b's batch i2 belongs to a's matrix i2 // (B2/A2), as in ggml.
    """
    b3, b2, n, c = x.shape
    s3, s2, s1, s0 = x.strides
    r3, r2 = b3 // a3, b2 // a2
    return np.lib.stride_tricks.as_strided(
        x, (a3, r3, a2, r2, n // rows, rows, c), (s3 * r3, s3, s2 * r2, s2, s1 * rows, s1, s0),
        writeable=x.flags.writeable)


def blas_ready(m: np.ndarray) -> np.ndarray:
    """BLAS needs unit stride along rows; other views (a transposed V) are copied so matmul stays fast."""
    if m.dtype != F32 or m.strides[-1] != F32.itemsize or m.strides[-2] % F32.itemsize:
        return np.ascontiguousarray(m, dtype=F32)
    return m


def vec_dot_rounding(w_type: TypeTraits, k: int) -> Callable[[np.ndarray], np.ndarray]:
    """What ggml does to the activations before the dot: convert them to w's vec_dot_type and back."""
    name = w_type.vec_dot_type
    if name in ("F32", "I32"):
        return _unchanged
    if name == "F16":
        return lambda x: x.astype(np.float16).astype(F32)
    try:
        dot_type = type_traits(name)
    except UnknownNameError:
        return _unchanged
    if dot_type.from_float is None or k % dot_type.block_size:
        return _unchanged
    return lambda x: to_f32(from_f32(x, dot_type), dot_type)


def _unchanged(x: np.ndarray) -> np.ndarray:
    return x
