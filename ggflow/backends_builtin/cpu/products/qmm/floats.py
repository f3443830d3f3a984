"""Kernels for unquantized weights: F32, F16, BF16.

No repacking: the kernels read the weight rows where they are (the mmap'd file). ggml's numerics:
F32 weights take F32 activations; F16 and BF16 weights take activations rounded to F16 / BF16 first
(their vec_dot_type), and the products are summed in f32.

A row dot product is a float reduction, which LLVM only vectorizes when allowed to reassociate
(``fastmath`` reassoc + contract, i.e. FMA); ggml's SIMD dot products reassociate the same way.
Each weight row is read once for up to ``TOKENS`` tokens, so batches stream the weights once.

One skeleton for the three types, specialised on the type's name as a numba string literal (as the
quantized types' ``qmm.template``): the only piece that differs is how an element becomes float32.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import literally, njit, prange, types
from numba.extending import intrinsic, overload

F32 = np.float32
ROWS_PER_TASK = 16  # rows one prange iteration handles: enough work to amortize the scheduling
TOKENS = 4          # tokens sharing one pass over a weight row (4 accumulators, 1 weight load each)
FAST = {"reassoc", "contract"}


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """IEEE half (given as its 16 bits) -> float32: LLVM's fpext, i.e. vcvtph2ps where F16C exists."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if bits.bitwidth != 16:
            v = builder.trunc(v, ir.IntType(16))
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def bf16_bits_to_f32(typingctx, bits):
    """bfloat16 (given as its 16 bits) -> float32: the bits are the top half of the float32."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if bits.bitwidth > 16:
            v = builder.trunc(v, ir.IntType(16))
        wide = builder.shl(builder.zext(v, ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def round_f32_to_f16(typingctx, v):
    """float32 -> nearest IEEE half (ties to even, as ggml's fp32 -> fp16, inf past its range) -> float32 again:
    LLVM's fptrunc, vcvtps2ph where F16C exists."""
    if not (isinstance(v, types.Float) and v.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(v), codegen


def _to_f32(kind, v):
    raise NotImplementedError("only called from compiled kernels")


@overload(_to_f32, inline="always")
def _ov_to_f32(kind, v):
    """The one per-type piece of this family: a stored element as float32, by the kind's literal name."""
    if not isinstance(kind, types.StringLiteral):
        return None
    if kind.literal_value == "F16":
        return lambda kind, v: f16_bits_to_f32(v)
    if kind.literal_value == "BF16":
        return lambda kind, v: bf16_bits_to_f32(v)
    return lambda kind, v: v


@njit(cache=True, fastmath=FAST, inline="always")
def _dots(kind, w, r, x, i0, nt, out):
    k = w.shape[1]
    if nt == TOKENS:
        s0 = F32(0)
        s1 = F32(0)
        s2 = F32(0)
        s3 = F32(0)
        for j in range(k):
            v = _to_f32(kind, w[r, j])
            s0 += v * x[i0, j]
            s1 += v * x[i0 + 1, j]
            s2 += v * x[i0 + 2, j]
            s3 += v * x[i0 + 3, j]
        out[i0, r] = s0
        out[i0 + 1, r] = s1
        out[i0 + 2, r] = s2
        out[i0 + 3, r] = s3
    else:
        for i in range(i0, i0 + nt):
            s = F32(0)
            for j in range(k):
                s += _to_f32(kind, w[r, j]) * x[i, j]
            out[i, r] = s


@njit(cache=True, fastmath=FAST, nogil=True)
def _task(kind, w, x, out, task):
    for r in range(task * ROWS_PER_TASK, min(w.shape[0], (task + 1) * ROWS_PER_TASK)):
        for i0 in range(0, x.shape[0], TOKENS):
            _dots(kind, w, r, x, i0, min(TOKENS, x.shape[0] - i0), out)


@njit(cache=True, fastmath=FAST, parallel=True, nogil=True)
def _mul_mat_parallel(kind, w, x, out):
    literally(kind)
    for task in prange(-(-w.shape[0] // ROWS_PER_TASK)):
        _task(kind, w, x, out, np.int64(task))   # the serial driver's index type: one compiled _task


@njit(cache=True, fastmath=FAST, nogil=True)
def _mul_mat_serial(kind, w, x, out):
    literally(kind)
    for task in range(-(-w.shape[0] // ROWS_PER_TASK)):
        _task(kind, w, x, out, task)


def entry_point(kind: str, parallel: bool, arg_types: tuple):
    """The compiled parallel or serial kernel for kind "F32" | "F16" | "BF16", called as f(kind, w, x, out)
    (arg_types: the numba types of w, x, out); compiled (or loaded from the cache) on first use.

    The compiled entry point, not the dispatcher: dispatching a str to a literal specialisation
    re-runs numba's typing on every call (see qmm.template)."""
    sig = (types.literal(kind),) + tuple(arg_types)
    return (_mul_mat_parallel if parallel else _mul_mat_serial).compile(sig)


def round_to_f16(x: np.ndarray) -> np.ndarray:
    """Activations as ggml feeds them to an F16 dot: rounded to half (ties to even), back in f32."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """ggml's fp32 -> bf16 (round to nearest even; NaN kept quiet), back in f32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = np.where(nan, (u & 0xFFFF0000) | 0x00400000, rounded).astype(np.uint32)
    return rounded.view(np.float32)
