"""Tensor: a descriptor of an n-d array in ggml's convention. Data is optional.

ggml's axes run innermost first: ``ne[0]`` is the row length, ``ne[1]`` the number of rows, and so on
up to 4 dims; ``nb[i]`` is the byte stride of axis i. For a blocked (quantized) type ``nb[0]`` is the
block size in bytes and a row takes ``nb[1]`` bytes. numpy's axes run the other way, so the numpy view
of a tensor has shape ``ne[::-1]`` and strides ``nb[::-1]``.

A tensor is either a leaf (op "none": a weight, a graph input, the KV cache) or the result of an op
on its ``src`` tensors. A view (reshape, permute, a slice of the KV cache) owns no memory: it reads
``view_src``'s memory at ``view_offs``. Memory is attached later, by the graph allocator or the model
loader, as ``buffer`` + ``offset``; building a graph allocates nothing.
"""
from __future__ import annotations

import enum
import itertools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ggflow.core.types import TypeTraits, type_traits

if TYPE_CHECKING:
    from ggflow.core.backend import Buffer

MAX_DIMS = 4


class TensorFlag(enum.IntFlag):
    INPUT = 1    # set from outside before each compute (tokens, positions, mask, KV indices)
    OUTPUT = 2   # read after compute: never share its memory with another tensor
    PARAM = 4    # a model weight or other persistent state (KV cache): memory owned outside the graph


_ids = itertools.count()


class Tensor:
    __slots__ = ("type", "ne", "nb", "op", "op_params", "src", "view_src", "view_offs",
                 "name", "flags", "buffer", "offset", "id")

    def __init__(self, type: "TypeTraits | str", ne: Sequence[int], nb: Sequence[int] | None = None,
                 op: str = "none", op_params: tuple[Any, ...] = (), src: Sequence["Tensor"] = (),
                 view_src: "Tensor | None" = None, view_offs: int = 0, name: str = "", flags: int = 0):
        self.type: TypeTraits = type_traits(type)
        ne = tuple(int(n) for n in ne)
        if not 1 <= len(ne) <= MAX_DIMS or any(n < 0 for n in ne):
            raise ValueError(f"tensor {name!r}: shape {ne} must have 1..{MAX_DIMS} non-negative dims")
        self.ne: tuple[int, int, int, int] = ne + (1,) * (MAX_DIMS - len(ne))  # type: ignore[assignment]
        dense = contiguous_strides(self.type, self.ne)
        nb = tuple(int(b) for b in nb) if nb is not None else ()
        # Strides not given for the outer dims continue densely from the last one given.
        for i in range(len(nb), MAX_DIMS):
            if i == 0:
                nb += (dense[0],)
            elif i == 1:  # a row holds ne[0] / block_size blocks
                nb += (nb[0] * (self.ne[0] // self.type.block_size),)
            else:
                nb += (nb[i - 1] * self.ne[i - 1],)
        self.nb: tuple[int, int, int, int] = nb  # type: ignore[assignment]
        self.op = op
        self.op_params = tuple(op_params)
        self.src: tuple[Tensor, ...] = tuple(src)
        self.view_src = view_src
        self.view_offs = int(view_offs)
        self.name = name
        self.flags = TensorFlag(flags)
        self.buffer: Buffer | None = None
        self.offset = 0
        self.id = next(_ids)  # stable identity for dicts and for ordering in dumps

    # -- shape ---------------------------------------------------------------------------------
    @property
    def n_dims(self) -> int:
        return max([i + 1 for i, n in enumerate(self.ne) if n != 1], default=1)

    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def row_bytes(self) -> int:
        return self.type.row_bytes(self.ne[0])

    @property
    def nbytes(self) -> int:
        """Bytes spanned from the first to one past the last element (what an allocation needs)."""
        if self.nelements == 0:
            return 0
        if self.type.block_size == 1:  # elements may be strided too (a transposed view)
            return self.type.type_size + sum((self.ne[i] - 1) * self.nb[i] for i in range(MAX_DIMS))
        return self.row_bytes + sum((self.ne[i] - 1) * self.nb[i] for i in range(1, MAX_DIMS))

    def is_contiguous(self) -> bool:
        return self.nb == contiguous_strides(self.type, self.ne)

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def is_leaf(self) -> bool:
        return self.op == "none"

    def base(self) -> "Tensor":
        """The tensor that owns the memory this one reads."""
        t = self
        while t.view_src is not None:
            t = t.view_src
        return t

    def base_offset(self) -> int:
        """Byte offset of this tensor's first element inside its base tensor."""
        offs, t = 0, self
        while t.view_src is not None:
            offs += t.view_offs
            t = t.view_src
        return offs

    # -- data ----------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A numpy view of this tensor's memory (host buffers only).

        Plain types give their element dtype with shape ``ne[::-1]``; blocked types give uint8 with the
        row's bytes as the last axis. No copy: writes go to the tensor.
        """
        base = self.base()
        if base.buffer is None:
            raise ValueError(f"tensor {self.name or self.op!r} has no memory: allocate the graph first")
        host = base.buffer.host_array()
        return strided_view(host, base.offset + self.base_offset(), self.type, self.ne, self.nb)

    def __repr__(self) -> str:
        shape = "x".join(str(n) for n in self.ne[: self.n_dims])
        return f"Tensor({self.name or '?'}: {self.op} {self.type.name}[{shape}])"


def contiguous_strides(traits: TypeTraits, ne: Sequence[int]) -> tuple[int, int, int, int]:
    nb0 = traits.type_size
    nb1 = traits.row_bytes(ne[0])
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def strided_view(host: np.ndarray, offset: int, traits: TypeTraits, ne: Sequence[int],
                 nb: Sequence[int]) -> np.ndarray:
    """numpy view of ggml-shaped memory inside a flat uint8 host array."""
    if traits.numpy_dtype is not None and traits.block_size == 1:
        dtype, shape, strides = traits.numpy_dtype, tuple(ne[::-1]), tuple(nb[::-1])
    else:  # blocked: expose each row's bytes
        dtype = np.dtype(np.uint8)
        shape = (ne[3], ne[2], ne[1], traits.row_bytes(ne[0]))
        strides = (nb[3], nb[2], nb[1], 1)
    return np.ndarray(shape, dtype=dtype, buffer=host, offset=offset, strides=strides)
