"""Elementwise ops: add and mul (with ggml's repeat broadcasting), scale, silu, tanh, gelu. Vectorized numpy.

F16 tensors are computed in float32 and rounded once to F16, as ggml's CPU kernels do; numpy ufuncs with
``dtype=float32`` and an F16 ``out`` do exactly that.

Where ggml's numbers differ from plain float32 math:
  - silu: ggml evaluates exp with a SIMD polynomial (ggml_v_expf) in blocks of 4/8/16 lanes, libm expf in
    the tail; numpy's expf differs from it by about one ulp.
  - gelu: ggml's CPU build defines GGML_GELU_FP16, so an F32 gelu rounds x to F16, looks the answer up in a
    table of F16 gelu values, and returns x itself for x >= 10 and 0 for x <= -10. We build the same
    table the same way (float32, libm's tanhf, GCC's fused multiply-add): all 65536 entries equal those
    of a native ggml build, so gelu is bit-exact. (numpy's own tanh differs in 234 entries by an F16 ulp.)
  - scale with a bias: ggml's SIMD loop computes x*s + b with one fused multiply-add; we compute it in
    float64 and round once to float32, which equals the FMA except in rare double-rounding cases.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

from ggflow.backends_builtin.cpu.arrays import (
    F32, F32Target, TensorArrays, is_native_float, split_repeats, to_f32)
from ggflow.backends_builtin.cpu.c_arith import fma_f32
from ggflow.core.tensor import Tensor

Kernel = Callable[[], None]

# ggml's constants for the tanh approximation (float32, as ggml declares them).
GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
GELU_LINEAR_ABOVE = np.float32(10.0)   # ggml_vec_gelu_f32 returns x itself from here up
GELU_ZERO_BELOW = np.float32(-10.0)    # and 0 from here down


# -- add, mul ------------------------------------------------------------------------------------
def bind_add(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_binary(node, arrays, np.add)


def bind_mul(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_binary(node, arrays, np.multiply)


def _bind_binary(node: Tensor, arrays: TensorArrays, ufunc: np.ufunc) -> Kernel:
    a, b = node.src
    reps = tuple(an // bn for an, bn in zip(a.ne[::-1], b.ne[::-1]))
    a_view, b_view, d_view = arrays.view(a), arrays.view(b), arrays.view(node)
    b_tiles = split_repeats(b_view, (1, 1, 1, 1))   # (1, n) per axis: broadcasts over a's repeats
    if all(is_native_float(t.type) for t in (a, b, node)):
        a_tiles, d_tiles = split_repeats(a_view, reps), split_repeats(d_view, reps)
        return lambda: ufunc(a_tiles, b_tiles, out=d_tiles, dtype=F32)

    target = F32Target(d_view, node)
    d_tiles = split_repeats(target.array, reps)

    def run_converted() -> None:
        b_values = split_repeats(to_f32(b_view, b.type), (1, 1, 1, 1))
        ufunc(split_repeats(to_f32(a_view, a.type), reps), b_values, out=d_tiles)
        target.flush()
    return run_converted


# -- scale ---------------------------------------------------------------------------------------
def bind_scale(node: Tensor, arrays: TensorArrays) -> Kernel:
    s, bias = (np.float32(p) for p in node.op_params)
    if bias == 0:
        def scale(x: np.ndarray, out: np.ndarray) -> None:
            np.multiply(x, s, out=out, dtype=F32)
    else:
        def scale(x: np.ndarray, out: np.ndarray) -> None:
            fused = np.multiply(x, np.float64(s), dtype=np.float64)
            fused += np.float64(bias)
            out[...] = fused.astype(F32)
    return _bind_unary(node, arrays, scale)


# -- silu ----------------------------------------------------------------------------------------
def silu_f32(x: np.ndarray, out: np.ndarray) -> None:
    """out = x / (1 + exp(-x)), computed in float32 (out may be F16: rounded once).

    exp(-x) overflows to inf for x < -88 (x/inf = -0, as in C): a compiled plan runs with numpy's overflow
    warning off, so other callers see a RuntimeWarning there, and the same values."""
    t = np.negative(x, dtype=F32)
    np.exp(t, out=t)
    t += np.float32(1.0)
    np.divide(x, t, out=out, dtype=F32)


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def silu_from_exp_mul(x, t, s, u, z):
    """s = x / (t + 1) for t = exp(-x): silu_f32's last two steps, then z = u * s (the mul of a gated FFN).
    1-D float32 arrays; fusion.py's silu -> mul chain."""
    one = np.float32(1.0)
    for i in range(x.shape[0]):
        v = x[i] / (t[i] + one)
        s[i] = v
        z[i] = u[i] * v


def bind_silu(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_unary(node, arrays, silu_f32)


# -- tanh ----------------------------------------------------------------------------------------
def tanh_f32(x: np.ndarray, out: np.ndarray) -> None:
    """ggml_vec_tanh_f32 is libm's tanhf per element; numpy's float32 tanh differs from it by an ulp at most."""
    np.tanh(x, out=out, dtype=F32)


def bind_tanh(node: Tensor, arrays: TensorArrays) -> Kernel:
    return _bind_unary(node, arrays, tanh_f32)


# -- gelu ----------------------------------------------------------------------------------------
@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def gelu_tanh_f32(x):
    """ggml_gelu_f32 on a float32 array: 0.5*x*(1 + tanh(sqrt(2/pi)*x*(1 + 0.044715*x*x))), with libm's
    tanhf and the one fused multiply-add GCC makes of it (1 + (a*x)*x), as a native ggml build computes."""
    out = np.empty_like(x)
    one = np.float32(1.0)
    for i in range(x.shape[0]):
        v = x[i]
        inner = fma_f32(GELU_COEF_A * v, v, one)
        out[i] = np.float32(0.5) * v * (one + np.tanh(SQRT_2_OVER_PI * v * inner))
    return out


_gelu_tables: dict[str, np.ndarray] = {}


def gelu_f16_table() -> np.ndarray:
    """ggml_table_gelu_f16: F16 bits -> F16 gelu of that value, for all 65536 bit patterns."""
    if "f16" not in _gelu_tables:
        x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F32)
        with np.errstate(over="ignore", invalid="ignore"):
            _gelu_tables["f16"] = gelu_tanh_f32(x).astype(np.float16)
        _gelu_tables["f32"] = _gelu_tables["f16"].astype(F32)
    return _gelu_tables["f16"]


def gelu_f32(x: np.ndarray, out: np.ndarray) -> None:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: a table lookup on x rounded to F16, clamped beyond +-10.

    out: a contiguous float32 array (a node's result or the F32 scratch of one).
    """
    gelu_f16_table()
    with np.errstate(over="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    np.take(_gelu_tables["f32"], bits, out=out, mode="clip")   # "clip": every uint16 is in range, no buffering
    linear = x >= GELU_LINEAR_ABOVE
    if linear.any():
        np.copyto(out, x, where=linear)
    zero = x <= GELU_ZERO_BELOW
    if zero.any():
        out[zero] = np.float32(0.0)


def bind_gelu(node: Tensor, arrays: TensorArrays) -> Kernel:
    (a,) = node.src
    if a.type.name == "F16" and node.type.name == "F16":
        # ggml_vec_gelu_f16 looks every input up in the table directly (no clamping).
        a_view, d_view, table = arrays.view(a), arrays.view(node), gelu_f16_table()

        def run_f16() -> None:
            d_view[...] = table[a_view.view(np.uint16)]
        return run_f16
    return _bind_unary(node, arrays, gelu_f32)


# -- shared --------------------------------------------------------------------------------------
def _bind_unary(node: Tensor, arrays: TensorArrays, fn: Callable[[np.ndarray, np.ndarray], None]) -> Kernel:
    """Bind fn(x_f32, out) to a node of one source: out is the destination when numpy can write it."""
    (a,) = node.src
    a_view, d_view = arrays.view(a), arrays.view(node)
    if is_native_float(node.type):
        if a.type.name == "F32":
            return lambda: fn(a_view, d_view)
        return lambda: fn(to_f32(a_view, a.type), d_view)

    target = F32Target(d_view, node)

    def run_converted() -> None:
        fn(to_f32(a_view, a.type), target.array)
        target.flush()
    return run_converted
