"""TypeTraits: the contract of a tensor element type (F32, F16, Q4_0, ...).

A type is stored as blocks: ``block_size`` elements packed into ``type_size`` bytes. A row of
``n`` elements (n a multiple of block_size) therefore takes ``n // block_size * type_size`` bytes.
Quant-type plugins register one TypeTraits per format; the core never needs to know the bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

# to_float:   (n_blocks, type_size) uint8   -> (n_blocks, block_size) float32
# from_float: (n_blocks, block_size) float32 -> (n_blocks, type_size) uint8
BlockDecoder = Callable[[np.ndarray], np.ndarray]
BlockEncoder = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class TypeTraits:
    name: str                        # as GGUF names it: "F32", "Q4_K", ...
    type_id: int                     # GGML type id (gguf.GGMLQuantizationType value)
    block_size: int                  # elements per block
    type_size: int                   # bytes per block
    to_float: BlockDecoder
    from_float: BlockEncoder | None  # None: the format cannot be written (only read)
    vec_dot_type: str                # type activations are quantized to for a dot with this type
    block_dtype: np.dtype | None = None  # numpy structured dtype describing one block's layout
    numpy_dtype: np.dtype | None = None  # plain element dtype for unblocked float types (F32, F16)
    # What a backend needs to run this type fast, by backend name: "cpu" takes a
    # ggflow.plugins.cpu_pieces.BlockPieces. Opaque to the core; a backend with no entry
    # for a type still runs it (the CPU converts such a weight once to F16).
    kernels: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_quantized(self) -> bool:
        return self.block_size > 1

    def row_bytes(self, n: int) -> int:
        if n % self.block_size:
            from ggflow.errors import QuantizationError
            raise QuantizationError(
                f"{self.name}: a row of {n} elements is not a multiple of the block size {self.block_size}")
        return n // self.block_size * self.type_size


def type_traits(key: "str | int | TypeTraits") -> TypeTraits:
    """Look a registered type up by name ("Q4_0") or GGML type id (2)."""
    if isinstance(key, TypeTraits):
        return key
    from ggflow.plugins.manager import get_plugin_manager
    registry = get_plugin_manager().quant_types
    if isinstance(key, (int, np.integer)):
        for reg in registry:
            if reg.obj.type_id == int(key):
                return reg.obj
        from ggflow.errors import UnknownNameError
        raise UnknownNameError("tensor type id", str(int(key)),
                               [f"{r.obj.type_id} ({r.name})" for r in registry])
    return registry.get(str(key).upper())


def _i32_to_float(blocks: np.ndarray) -> np.ndarray:
    return blocks.view(np.int32).astype(np.float32)


def _float_to_i32(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks, dtype=np.float32).astype(np.int32).view(np.uint8)


# I32 holds token ids, positions and KV-cache row indices: graph inputs every model needs,
# so the core provides it rather than a format plugin.
I32 = TypeTraits("I32", 26, 1, 4, _i32_to_float, _float_to_i32, "I32", numpy_dtype=np.dtype(np.int32))


from ggflow.plugins.hookspecs import hookimpl  # noqa: E402  (after the definitions it registers)
from ggflow.plugins.removed import removed_names


@hookimpl
def register_quant_types(register) -> None:
    register(I32)


__getattr__ = removed_names(__name__)   # a removed name says what replaced it
