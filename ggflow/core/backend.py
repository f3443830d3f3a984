"""Backend and Buffer: what a compute backend plugin implements.

A backend owns memory (Buffers from its ``alloc_buffer``) and runs runs of graph nodes whose inputs are
in its memory (``compute``). The scheduler decides which backend runs which node and copies tensors
between backends with ``get_tensor`` / ``set_tensor``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping, Sequence

import numpy as np

from ggflow.core.tensor import Tensor, contiguous_strides, strided_view
from ggflow.errors import BackendError
from ggflow.plugins.removed import removed_names


class Buffer(ABC):
    """A contiguous block of one backend's memory. Tensors live in it at byte offsets."""

    size: int
    backend_name: str

    @property
    def is_host(self) -> bool:
        """True when the memory is host memory numpy can view (``host_array``)."""
        return False

    def host_array(self) -> np.ndarray:
        raise TypeError(f"{self.backend_name} buffer is not host memory")

    @abstractmethod
    def write(self, offset: int, data: np.ndarray) -> None:
        """Copy a contiguous host array into the buffer at a byte offset."""

    @abstractmethod
    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """Copy nbytes at a byte offset out to a new uint8 host array."""

    def release(self, offset: int, nbytes: int) -> int:
        """A hint that no one reads these bytes where they are any more (their owner keeps a copy):
        memory that can give them back does, and stays readable. Returns the bytes given back."""
        return 0


class HostBuffer(Buffer):
    """Host memory: a numpy uint8 array, either owned or a view (e.g. of a memory-mapped GGUF file)."""

    def __init__(self, array: np.ndarray, backend_name: str = "cpu",
                 release: Callable[[int, int], int] | None = None, fileno: int | None = None):
        """release: how a view of a memory map drops a range's resident pages (GGUFFile.release); owned
        memory has none (dropping its pages would lose the data). fileno: for a view of a whole mapped
        file, a descriptor of that file, byte offsets the same: a kernel may read rows with pread
        from it, which maps no pages (the token embedding's get_rows)."""
        self.array = array if array.dtype == np.uint8 else array.view(np.uint8)
        self.size = self.array.nbytes
        self.backend_name = backend_name
        self._release = release
        self.fileno = fileno

    @classmethod
    def allocate(cls, size: int, backend_name: str = "cpu", alignment: int = 64) -> "HostBuffer":
        # Over-allocate and slice so the first byte is aligned: SIMD kernels prefer aligned rows. Zeroed, as
        # llama.cpp clears its KV buffers: a kernel that reads the cells the mask hides (instead of skipping
        # them) must find numbers there, not garbage (inf x 0 is NaN). np.zeros of a large size maps zero
        # pages (calloc): it costs no more than np.empty until written.
        raw = np.zeros(size + alignment, dtype=np.uint8)
        start = (-raw.ctypes.data) % alignment
        return cls(raw[start:start + size], backend_name)

    @property
    def is_host(self) -> bool:
        return True

    def host_array(self) -> np.ndarray:
        return self.array

    def write(self, offset: int, data: np.ndarray) -> None:
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.array[offset:offset + flat.nbytes] = flat

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.array[offset:offset + nbytes].copy()

    def release(self, offset: int, nbytes: int) -> int:
        return self._release(offset, nbytes) if self._release is not None else 0


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""
    priority: int | None = None   # the rank an instance would have here, when the probe found it (else the class's)

    def __bool__(self) -> bool:
        return self.available


@dataclass(frozen=True)
class BackendOptions:
    """What every backend factory is given (``factory(options)``); a backend uses what applies to it."""

    n_threads: int | None = None   # host threads for parallel kernels; None: the runtime's default (all cores)

    def __post_init__(self) -> None:
        if self.n_threads is not None and self.n_threads < 1:
            raise BackendError(f"n_threads must be at least 1, got {self.n_threads}")


class Backend(ABC):
    """A compute backend. The class is the factory registered through ``register_backends``: it is
    called with a ``BackendOptions`` (``make_backends`` passes the Context's)."""

    name: ClassVar[str]
    alignment: ClassVar[int] = 64    # byte alignment of tensors in this backend's buffers
    description: ClassVar[str] = ""
    # Higher is preferred by backend="auto", which leaves out backends below 0 (slower than the CPU).
    # A backend whose rank depends on what it finds (a GPU or a CPU driver) sets it per instance.
    priority: int = 0
    # ggml's supports_buft for host buffers: kernels read a tensor in host memory (a buffer whose
    # ``is_host`` holds: the mapped weights, the CPU's KV cache and activations) where it lies, with no copy.
    # The scheduler then offers such a backend the nodes the CPU would run (``op_cost``).
    reads_host_memory: ClassVar[bool] = False
    host_memory: ClassVar[bool] = False   # its own buffers are host memory (another host reader reads them)

    def __init__(self, options: BackendOptions = BackendOptions()):
        self.options = options

    @classmethod
    def is_available(cls) -> Availability:
        return Availability(True)

    @abstractmethod
    def alloc_buffer(self, size: int) -> Buffer:
        """Memory for ``size`` bytes of tensors on this backend."""

    def supports_op(self, node: Tensor) -> bool:
        """Whether compute() can run this node (its op, its types, its shapes)."""
        return True

    def offload_op(self, node: Tensor) -> bool:
        """Whether to take a node that reads a weight the fallback (CPU) backend holds, when this backend
        supports it. The scheduler then copies the weight here once and keeps the copy for every later
        graph. Say no to keep a weight's consumers (and its memory) on the CPU; ggml asks the same
        question (``offload_op``) before it copies a weight to a GPU."""
        return True

    def op_cost(self, node: Tensor) -> float | None:
        """What running ``node`` here costs, the fallback (CPU) running it costing 1.0; None: not offered.

        Asked only of a backend that ``reads_host_memory``, for a node the CPU would run whose sources all
        lie in host memory: the node moves to the backend with the lowest cost below 1.0 (the earlier by
        priority on a tie), reading its sources where they lie. Default: 0.5 where ``offload_op`` says
        yes. ggml asks ``offload_op`` the same question (e.g. a batch large enough to pay off)."""
        return 0.5 if self.offload_op(node) else None

    def reads_memory_of(self, other: "Backend") -> bool:
        """Whether this backend's kernels read tensors that live on ``other`` without a copy."""
        return other is self or (self.reads_host_memory and other.host_memory)

    def prepare_weight(self, tensor: Tensor) -> None:
        """Optional hook, called once per weight at load by the default ``adopt_weights`` (e.g. to repack
        its blocks into a layout the kernels read fast, instead of on the first compute). A backend that
        keeps such a copy calls ``tensor.buffer.release(tensor.offset, tensor.nbytes)`` after it."""

    def adopt_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Optional hook: take over model weights (which load as views of the host memory map), before
        any graph exists.

        Context offers a model's weights to its first backend once. A device backend may upload the ones
        its kernels read and re-point them (``tensor.buffer``/``offset``) to its own memory, so nodes
        that read them are placed on it; the weights then stay there, and a Context that doesn't
        schedule this backend needs its own ``Model.load``. A backend that doesn't adopt loses nothing:
        the scheduler places the nodes it supports on it anyway and copies the weights those nodes read
        to it once, when it first allocates a graph that reads them (``offload_op``). Host backends keep the weights where
        they are; the default prepares each one (``prepare_weight``).
        """
        for tensor in weights.values():
            self.prepare_weight(tensor)

    @abstractmethod
    def compute(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None) -> None:
        """Run nodes in order. ``substitutes`` maps a source tensor that lives on another backend to
        its copy in this backend's memory; the backend reads the copy wherever the source is used."""

    def compile(self, nodes: Sequence[Tensor], substitutes: Mapping[Tensor, Tensor] | None = None
                ) -> "Callable[[], None]":
        """Prepare a reusable plan for these nodes once their memory is fixed; calling it computes them.

        The scheduler compiles each split after allocation and calls the plan on every reuse of the
        graph, so a backend can bind kernels and buffers here and keep the per-step cost small.
        """
        return lambda: self.compute(nodes, substitutes)

    # -- transfers (the scheduler's copies and graph inputs/outputs) --------------------------------
    def set_tensor(self, tensor: Tensor, data: np.ndarray) -> None:
        """Write host data (any layout, tensor's shape) into a contiguous tensor on this backend."""
        base = tensor.base()
        if base.buffer is None:
            raise ValueError(f"{tensor!r} has no memory")
        if not tensor.is_contiguous():
            raise ValueError(f"set_tensor needs a contiguous tensor, {tensor!r} is not")
        base.buffer.write(base.offset + tensor.base_offset(), _as_bytes(tensor, data))

    def get_tensor(self, tensor: Tensor) -> np.ndarray:
        """A contiguous host copy of the tensor's data (views resolved), shaped like Tensor.numpy()."""
        base = tensor.base()
        if base.buffer is None:
            raise ValueError(f"{tensor!r} has no memory")
        if base.buffer.is_host:
            return np.array(tensor.numpy(), order="C", copy=True)  # a copy: the buffer is reused
        start = base.offset + tensor.base_offset()
        raw = base.buffer.read(start, tensor.nbytes)
        return np.ascontiguousarray(strided_view(raw, 0, tensor.type, tensor.ne, tensor.nb))

    def synchronize(self) -> None:
        """Wait for queued work (asynchronous backends)."""


def substituted_memory(t: Tensor, substitutes: Mapping[Tensor, Tensor], backend_name: str) -> tuple[Tensor, int]:
    """Where a node's source is for a backend that was given copies (``substitutes``) of some tensors:
    the tensor whose memory holds it and the extra byte offset into that memory.

    A view of a copied tensor reads the copy at the same relative offset, which is only right when the
    copy has the copied tensor's layout (the scheduler's copies keep it: same strides, same bytes)."""
    direct = substitutes.get(t)
    if direct is not None:
        return direct, 0
    offset, cur = 0, t
    while cur.view_src is not None:
        offset += cur.view_offs
        cur = cur.view_src
        sub = substitutes.get(cur)
        if sub is not None:
            if sub.nb != cur.nb:
                raise BackendError(f"{t!r} views {cur!r}, whose copy from another backend has other strides: "
                                   f"the {backend_name} backend cannot map the view onto the copy")
            return sub, offset
    return t, 0


def _as_bytes(tensor: Tensor, data: np.ndarray) -> np.ndarray:
    traits = tensor.type
    if traits.numpy_dtype is not None and traits.block_size == 1:
        data = np.asarray(data, dtype=traits.numpy_dtype)
        expected = tensor.nelements
    else:
        data = np.asarray(data, dtype=np.uint8)
        expected = tensor.nrows * tensor.row_bytes
    if data.size != expected:
        raise ValueError(f"{tensor!r} holds {expected} values, got {data.size}")
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


__all__ = ["Availability", "Backend", "BackendOptions", "Buffer", "HostBuffer", "contiguous_strides"]


__getattr__ = removed_names(__name__)   # a removed name says what replaced it
