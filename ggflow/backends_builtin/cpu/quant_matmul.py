"""Matrix multiplication of GGUF weights (every quant type the CPU backend runs) with f32 activations.

    pw = pack_weight(w, "Q4_K")          # once per weight, at load
    mul_mat(pw, x, out)                  # out[i, r] = dot(W[r], x[i]); x (n, k) f32, out (n, rows) f32

Numerics follow ggml: activations are quantized to the weight type's vec_dot_type (Q8_0 for
Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K types) with ggml's reference quantizers, the block
dot products are exact integers, and the scales are applied and accumulated in f32. F16 and BF16
weights take activations rounded to F16 / BF16; F32 weights take them as they are.

Quantized weights are repacked once into a row-tiled layout (see ``_qmm_layout``): a copy about
the size of the GGUF data (+1% to +20%: f16 scales widened to f32, 6-bit scales unpacked; Q3_K +35%,
its quants widened to nibbles); the mmap'd bytes are not kept. F32/F16/BF16 weights are used in
place (a reference to ``w``, no copy). docs/performance.md has the per-type figures and speeds.

n == 1 (decode) and small n take the matvec path (one decode-and-multiply pass per token); larger n
the batched one, which decodes each block of a row tile once and reuses it for all tokens (the
switch is inside each type's kernel, ``MATVEC_MAX_TOKENS`` of its module).
Threads: numba's prange over row tiles, as many as ``numba.set_num_threads`` allows; products below
``PARALLEL_MIN_MACS``, and every product on one thread, run on the calling thread; ``bind_mul_mat``'s
bigger ones run parallel or serial, whichever is faster now (``thread_choice``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numba
import numpy as np

from ggflow.backends_builtin.cpu import _qmm_act as act
from ggflow.backends_builtin.cpu import _qmm_float as flt
from ggflow.backends_builtin.cpu import _qmm_kquants as kq
from ggflow.backends_builtin.cpu import _qmm_legacy as leg
from ggflow.backends_builtin.cpu import thread_choice
from ggflow.backends_builtin.cpu._qmm_layout import TILE
from ggflow.errors import BackendError, ShapeError

# Below this many multiply-adds (n * rows * k) a product runs on the calling thread: starting a
# parallel region costs 10-20 us on an idle machine and a scheduler slice (ms) on a busy one, more
# than a small weight takes (1 Mi multiply-adds: about 0.1 ms on one core).
PARALLEL_MIN_MACS = 1 << 20


@dataclass(frozen=True)
class _QuantKernels:
    block_size: int
    type_size: int
    vec_dot_type: str                    # "Q8_0" | "Q8_1" | "Q8_K"
    pack: Callable[[np.ndarray, int, int], tuple]
    kernel: Callable                     # (*packed arrays, *quantized activations, out) -> None
    serial: Callable                     # the same on the calling thread only, for small products


_QUANT: dict[str, _QuantKernels] = {
    "Q4_0": _QuantKernels(32, 18, "Q8_0", leg.pack_q4_0, leg.mul_mat_q4_0, leg.mul_mat_q4_0_serial),
    "Q4_1": _QuantKernels(32, 20, "Q8_1", leg.pack_q4_1, leg.mul_mat_q4_1, leg.mul_mat_q4_1_serial),
    "Q5_0": _QuantKernels(32, 22, "Q8_0", leg.pack_q5_0, leg.mul_mat_q5_0, leg.mul_mat_q5_0_serial),
    "Q5_1": _QuantKernels(32, 24, "Q8_1", leg.pack_q5_1, leg.mul_mat_q5_1, leg.mul_mat_q5_1_serial),
    "Q8_0": _QuantKernels(32, 34, "Q8_0", leg.pack_q8_0, leg.mul_mat_q8_0, leg.mul_mat_q8_0_serial),
    "Q2_K": _QuantKernels(256, 84, "Q8_K", kq.pack_q2_k, kq.mul_mat_q2_k, kq.mul_mat_q2_k_serial),
    "Q3_K": _QuantKernels(256, 110, "Q8_K", kq.pack_q3_k, kq.mul_mat_q3_k, kq.mul_mat_q3_k_serial),
    "Q4_K": _QuantKernels(256, 144, "Q8_K", kq.pack_q4_k, kq.mul_mat_q4_k, kq.mul_mat_q4_k_serial),
    "Q5_K": _QuantKernels(256, 176, "Q8_K", kq.pack_q5_k, kq.mul_mat_q5_k, kq.mul_mat_q5_k_serial),
    "Q6_K": _QuantKernels(256, 210, "Q8_K", kq.pack_q6_k, kq.mul_mat_q6_k, kq.mul_mat_q6_k_serial),
}

# element dtype, bytes per element, kernel, serial kernel, activation rounding
_FLOAT = {
    "F32": (np.float32, 4, flt.mul_mat_f32, flt.mul_mat_f32_serial, None),
    "F16": (np.uint16, 2, flt.mul_mat_f16, flt.mul_mat_f16_serial, flt.round_to_f16),
    "BF16": (np.uint16, 2, flt.mul_mat_bf16, flt.mul_mat_bf16_serial, flt.round_to_bf16),
}

SUPPORTED_TYPES: frozenset[str] = frozenset(_QUANT) | frozenset(_FLOAT)


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A weight ready for ``mul_mat``: its type, logical shape and the arrays the kernels read."""
    w_type: str
    rows: int
    k: int
    arrays: tuple

    @property
    def nbytes(self) -> int:
        """Memory the packed arrays hold (for F32/F16/BF16: the caller's array, not a copy)."""
        return sum(a.nbytes for a in self.arrays)


def pack_weight(w: np.ndarray, w_type: str) -> PackedWeight:
    """Prepare a 2-D GGUF weight (rows = ggml ne1, k = ne0) for ``mul_mat``.

    ``w`` is (rows, row_bytes) uint8 as stored in the file; F32/F16/BF16 may also come as their
    (rows, k) float32 / float16 / uint16 array.
    """
    w_type = str(w_type).upper()
    if w_type not in SUPPORTED_TYPES:
        raise BackendError(f"no CPU matmul kernel for weight type {w_type!r}; kernels exist for "
                           f"{', '.join(sorted(SUPPORTED_TYPES))} (dequantize to F32 for others)")
    w = np.asarray(w)
    if w.ndim != 2:
        raise ShapeError(f"pack_weight wants a 2-D weight (rows, row bytes), got shape {w.shape}")
    if w_type in _FLOAT:
        return _pack_float(w, w_type)
    kern = _QUANT[w_type]
    if w.dtype != np.uint8:
        raise ShapeError(f"{w_type} weight must be the raw uint8 block bytes, got dtype {w.dtype}")
    rows, row_bytes = w.shape
    if row_bytes % kern.type_size:
        raise ShapeError(f"{w_type} rows of {row_bytes} bytes are not a whole number of "
                         f"{kern.type_size}-byte blocks")
    k = row_bytes // kern.type_size * kern.block_size
    arrays = kern.pack(np.ascontiguousarray(w), rows, k)
    return PackedWeight(w_type, rows, k, tuple(arrays))


def _pack_float(w: np.ndarray, w_type: str) -> PackedWeight:
    dtype, size = _FLOAT[w_type][:2]
    if w.dtype == np.uint8:
        if w.shape[1] % size:
            raise ShapeError(f"{w_type} rows of {w.shape[1]} bytes are not whole {size}-byte elements")
        w = np.ascontiguousarray(w).view(dtype)
    elif w_type == "F16" and w.dtype == np.float16:
        w = w.view(np.uint16)
    elif w.dtype != dtype:
        raise ShapeError(f"{w_type} weight must be uint8 bytes or a {np.dtype(dtype).name} array, got {w.dtype}")
    w = np.ascontiguousarray(w)   # a no-op for the mmap'd views the loader passes
    return PackedWeight(w_type, w.shape[0], w.shape[1], (w,))


def mul_mat(pw: PackedWeight, x: np.ndarray, out: np.ndarray) -> None:
    """out[i, r] = dot(W[r], x[i]) for x (n, k) float32; out (n, rows) float32 is written in place."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    _check_shapes(pw, x, out)
    if x.shape[0] == 0 or pw.rows == 0:
        return
    target = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
    parallel = use_parallel(x.shape[0] * pw.rows * pw.k, numba.get_num_threads())
    if pw.w_type in _FLOAT:
        _, _, kernel, serial, rounding = _FLOAT[pw.w_type]
        (kernel if parallel else serial)(pw.arrays[0], rounding(x) if rounding else x, target)
    else:
        kern = _QUANT[pw.w_type]
        (kern.kernel if parallel else kern.serial)(*pw.arrays, *quantize_activations(x, kern.vec_dot_type), target)
    if target is not out:
        out[...] = target


def bind_mul_mat(pw: PackedWeight, x: np.ndarray, out: np.ndarray, n_threads: int | None = None,
                 scratch: dict | None = None) -> Callable[[], None]:
    """``mul_mat(pw, x, out)`` prepared once for arrays whose memory stays put (a compiled plan's views).

    The checks, the choice of kernel and the activation buffers are settled here, so a call is one
    quantization and one kernel: what mul_mat costs on top of them (~2 us) is paid per plan, not per
    step. n_threads: what the call runs on (None: numba's count now); one thread always runs serially.
    A product big enough for threads runs parallel or serial, whichever its size's recent calls found
    faster (thread_choice: a busy machine makes the parallel one the slower). scratch: a dict shared by
    calls that never run at the same time (one plan's), which then share one set of activation buffers
    per type and shape (a prompt's would otherwise hold n x k int16 per weight); None: buffers of its own.
    """
    _check_shapes(pw, x, out)
    if not (x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous) or 0 in out.shape:
        return lambda: mul_mat(pw, x, out)
    threads = numba.get_num_threads() if n_threads is None else n_threads
    if pw.w_type in _FLOAT:
        _, _, kernel, serial, rounding = _FLOAT[pw.w_type]
        if rounding is None:
            products = [partial(run, pw.arrays[0], x, out) for run in (serial, kernel)]
        else:
            products = [lambda run=run: run(pw.arrays[0], rounding(x), out) for run in (serial, kernel)]
        if not use_parallel(x.shape[0] * pw.rows * pw.k, threads):
            return products[0]
        return thread_choice.adaptive((pw.w_type, *x.shape, pw.rows, threads), products[1], products[0])
    kern = _QUANT[pw.w_type]
    quantize = _ACTIVATION_QUANTIZERS[kern.vec_dot_type]
    key = ("activations", kern.vec_dot_type, *x.shape)
    buffers = scratch.get(key) if scratch is not None else None
    if buffers is None:
        buffers = quantize_activations(x, kern.vec_dot_type)   # the buffers; refilled at every call
        if scratch is not None:
            scratch[key] = buffers
    xq, d, extra = buffers
    args = (*pw.arrays, xq, d, extra, out)
    product = partial(kern.serial, *args)
    if use_parallel(x.shape[0] * pw.rows * pw.k, threads):   # parallel or serial, whichever is faster now
        product = thread_choice.adaptive((pw.w_type, *x.shape, pw.rows, threads), partial(kern.kernel, *args), product)

    def run_quantized() -> None:
        quantize(x, xq, d, extra)
        product()
    return run_quantized


def use_parallel(macs: int, n_threads: int) -> bool:
    """Whether a product of this many multiply-adds runs on numba's threads (see PARALLEL_MIN_MACS)."""
    return n_threads > 1 and macs >= PARALLEL_MIN_MACS


def _check_shapes(pw: PackedWeight, x: np.ndarray, out: np.ndarray) -> None:
    if x.ndim != 2 or x.shape[1] != pw.k:
        raise ShapeError(f"mul_mat: activations of shape {x.shape} do not match a weight of "
                         f"{pw.rows} rows x {pw.k} columns (want (n, {pw.k}))")
    n = x.shape[0]
    if out.shape != (n, pw.rows) or out.dtype != np.float32:
        raise ShapeError(f"mul_mat: out must be float32 of shape {(n, pw.rows)}, got {out.dtype} {out.shape}")


def quantize_activations(x: np.ndarray, vec_dot_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, k) f32 -> the kernels' split form of ``vec_dot_type``: (values int16 (n, k), scales
    f32 per block, extra) with extra = int32 block sums (Q8_0), f32 d*sum (Q8_1), int32 sums of
    16 (Q8_K). ``_qmm_act.*_to_ggml_bytes`` turn these into ggml's block bytes."""
    n, k = x.shape
    xq = np.empty((n, k), np.int16)
    if vec_dot_type == "Q8_K":
        d = np.empty((n, k // 256), np.float32)
        extra = np.empty((n, k // 16), np.int32)
        act.quantize_q8_K(x, xq, d, extra)
        return xq, d, extra
    d = np.empty((n, k // 32), np.float32)
    if vec_dot_type == "Q8_1":
        extra = np.empty((n, k // 32), np.float32)
        act.quantize_q8_1(x, xq, d, extra)
    else:
        extra = np.empty((n, k // 32), np.int32)
        act.quantize_q8_0(x, xq, d, extra)
    return xq, d, extra


_ACTIVATION_QUANTIZERS = {"Q8_0": act.quantize_q8_0, "Q8_1": act.quantize_q8_1, "Q8_K": act.quantize_q8_K}


__all__ = ["SUPPORTED_TYPES", "PackedWeight", "pack_weight", "mul_mat", "bind_mul_mat", "quantize_activations", "TILE"]
