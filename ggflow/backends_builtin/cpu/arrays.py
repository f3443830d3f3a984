"""numpy views of tensors for the CPU kernels, and the type conversions every kernel shares.

A kernel is bound once to the numpy views of its node's sources and destination (``TensorArrays.view``)
and re-run many times: the views stay valid as long as the tensors keep their memory, and reading a view
at run time sees whatever the graph inputs hold by then.

Values are computed in float32. ``to_f32`` turns any tensor view into float32 values (F32 as is, F16 by
an exact cast, any other type through its ``TypeTraits.to_float``); ``from_f32`` turns float32 values into
a type's numpy representation (F16 by numpy's round-to-nearest-even cast, which is what ggml's CPU
conversion does; any other type through ``TypeTraits.from_float``).
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ggflow.core.backend import substituted_memory
from ggflow.core.tensor import Tensor, strided_view
from ggflow.core.types import TypeTraits
from ggflow.errors import BackendError

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


class TensorArrays:
    """Resolves a tensor to a numpy view of its memory, reading a substitute's copy where one is given."""

    def __init__(self, substitutes: Mapping[Tensor, Tensor] | None = None):
        self.substitutes = substitutes or {}
        # What the kernels of one plan share, by a key of their own (rope: the cos/sin tables of a set of
        # positions; matmuls: activation buffers). Kernels are bound in the order they run, and one plan
        # never runs two at once.
        self.shared: dict = {}

    def view(self, t: Tensor) -> np.ndarray:
        memory_of, offset = substituted_memory(t, self.substitutes, "CPU")
        return _host_view(memory_of, t, offset)

    def scratch(self, purpose: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """One array per purpose, shape and dtype for all of the plan's kernels: for what a kernel writes and
        reads back within one call (one per layer would hold, say, a prompt's queries once per layer)."""
        key = ("scratch", purpose, tuple(shape), np.dtype(dtype).str)
        if key not in self.shared:
            self.shared[key] = np.empty(shape, dtype)
        return self.shared[key]

    def f32_reader(self, t: Tensor) -> Callable[[], np.ndarray]:
        """A function returning t's values as float32 (numpy shape ne[::-1]), read afresh on each call.

        A blocked (quantized) view whose blocks do not run along ne[0] -- V of a quantized KV cache,
        permuted so that cells run along ne[0] for V x P -- has no per-row byte layout to decode:
        the rows of its base tensor that it spans are decoded and the view's strides applied to the
        float32 values instead (a byte stride s of the blocked layout is s * block_size / type_size
        floats; the blocked dimension's own stride, one block, is one float).
        """
        traits = t.type
        if traits.block_size == 1 or t.nb[0] == traits.type_size:
            view = self.view(t)
            return lambda: to_f32(view, traits)
        root = t.base()
        if root.type is not traits or not root.is_contiguous():
            raise BackendError(f"{t!r}: a {traits.name} view whose blocks do not run along ne[0] must view a "
                               "contiguous tensor of its type")
        rows = self.view(root).reshape(-1, root.row_bytes)
        bs, ts, row_bytes = traits.block_size, traits.type_size, root.row_bytes
        blocked = next(d for d in range(4) if t.nb[d] == ts and t.ne[d] % bs == 0)
        offset = t.base_offset()
        last = offset + (t.ne[blocked] // bs) * ts + sum((t.ne[d] - 1) * t.nb[d] for d in range(4) if d != blocked)
        r0, r1 = offset // row_bytes, -(-last // row_bytes)
        if any(t.nb[d] % ts for d in range(4)) or offset % ts:
            raise BackendError(f"{t!r}: strides are not whole {traits.name} blocks")
        floats = [1 if d == blocked else t.nb[d] // ts * bs for d in range(4)]
        start = (offset - r0 * row_bytes) // ts * bs
        shape = tuple(t.ne[::-1])
        strides = tuple(F32.itemsize * f for f in floats[::-1])

        def read() -> np.ndarray:
            values = to_f32(rows[r0:r1], traits).reshape(-1)
            return np.lib.stride_tricks.as_strided(values[start:], shape, strides, writeable=False)
        return read


def _host_view(memory_of: Tensor, shaped_as: Tensor, extra_offset: int) -> np.ndarray:
    """View shaped like ``shaped_as`` of the memory ``memory_of`` occupies, ``extra_offset`` bytes in."""
    base = memory_of.base()
    if base.buffer is None:
        raise BackendError(f"{shaped_as!r} has no memory: allocate the graph before compiling it")
    if not base.buffer.is_host:
        raise BackendError(f"{shaped_as!r} lives in a {base.buffer.backend_name!r} buffer; "
                           "the CPU backend reads host memory only")
    start = base.offset + memory_of.base_offset() + extra_offset
    return strided_view(base.buffer.host_array(), start, shaped_as.type, shaped_as.ne, shaped_as.nb)


def is_native_float(traits: TypeTraits) -> bool:
    """F32 and F16: numpy computes with them directly."""
    return traits.name in ("F32", "F16")


def to_f32(arr: np.ndarray, traits: TypeTraits) -> np.ndarray:
    """float32 values of a tensor view (numpy shape ne[::-1]). F32 is returned as is, not copied."""
    if traits.name == "F32":
        return arr
    if traits.name == "F16":
        return arr.astype(F32)
    rows = np.ascontiguousarray(arr).view(np.uint8)
    blocks = rows.reshape(-1, traits.type_size)
    values = np.asarray(traits.to_float(blocks), dtype=F32)
    n0 = rows.shape[-1] // traits.type_size * traits.block_size
    return values.reshape(*arr.shape[:-1], n0)


def from_f32(values: np.ndarray, traits: TypeTraits) -> np.ndarray:
    """float32 values (..., ne0) -> the numpy representation of a tensor of this type."""
    if is_native_float(traits):
        return values.astype(traits.numpy_dtype, copy=False)
    if traits.from_float is None:
        raise BackendError(f"the CPU backend cannot write {traits.name} tensors: the type has no from_float")
    values = np.ascontiguousarray(values, dtype=F32)
    encoded = np.asarray(traits.from_float(values.reshape(-1, traits.block_size)), dtype=np.uint8)
    if traits.is_quantized or traits.numpy_dtype is None:
        return encoded.reshape(*values.shape[:-1], traits.row_bytes(values.shape[-1]))
    return encoded.reshape(-1).view(traits.numpy_dtype).reshape(values.shape)


def store(dst: np.ndarray, values: np.ndarray, traits: TypeTraits) -> None:
    """Write float32 values (dst's logical shape) into a tensor view of any type."""
    if is_native_float(traits):
        dst[...] = values  # numpy's float32 -> float16 cast rounds to nearest even, as ggml does
    else:
        dst[...] = from_f32(values, traits)


def split_repeats(arr: np.ndarray, reps: tuple[int, ...]) -> np.ndarray:
    """View each axis of length n as (reps, n // reps): index i becomes (i // (n//reps), i % (n//reps)).

    ggml's repeat broadcasting maps index i of a to i % len(b) in b; with a split this way, b (shaped
    (1, len) per axis) broadcasts by numpy's own rules. Always a view, whatever the strides.
    """
    shape, strides = [], []
    for n, s, r in zip(arr.shape, arr.strides, reps):
        inner = n // r
        shape += [r, inner]
        strides += [s * inner, s]
    return np.lib.stride_tricks.as_strided(arr, shape, strides, writeable=arr.flags.writeable)


class F32Target:
    """Where a kernel writes float32 results for a destination view: the view itself when it is F32,
    else a float32 scratch array that ``flush`` converts into the destination's type."""

    __slots__ = ("dst", "traits", "array")

    def __init__(self, dst: np.ndarray, tensor: Tensor):
        self.dst, self.traits = dst, tensor.type
        direct = tensor.type.name == "F32"
        self.array = dst if direct else np.empty(tensor.ne[::-1], dtype=F32)

    @property
    def is_direct(self) -> bool:
        return self.array is self.dst

    def flush(self) -> None:
        if self.array is not self.dst:
            store(self.dst, self.array, self.traits)
