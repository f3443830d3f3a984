"""Tensor data: the input's bytes memory-mapped, and rows decoded to float32 and encoded in the output
type a slab at a time, with the overflow check llama-quantize applies."""
from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from ggflow.core.quants import dequantize, quantize, takes_importance
from ggflow.core.types import TypeTraits
from ggflow.errors import QuantizationError
from ggflow.quantize_model.plan import Planned

SLAB_FLOATS = 1 << 24  # float32 elements converted at once (64 MiB): bounds memory on huge tensors


class InputData:
    """The input's bytes, memory-mapped, with the pages of finished tensors handed back.

    The pages are file-backed, so the kernel could drop them anyway, but until it does they count in
    the process's resident size: without release() a run would look as large as the whole input
    (llama.cpp unmaps each weight after use for the same reason).
    """

    def __init__(self, path: str):
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)

    def rows(self, offset: int, n: int, n_rows: int) -> np.ndarray:
        """The n bytes at offset, one row of bytes per tensor row."""
        return self._bytes[offset:offset + n].reshape(n_rows, -1)

    def release(self, offset: int, n: int) -> None:
        if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_DONTNEED") and n:
            start = offset - offset % mmap.PAGESIZE
            self._mm.madvise(mmap.MADV_DONTNEED, start, offset + n - start)

    def __enter__(self) -> "InputData":
        return self

    def __exit__(self, *exc: Any) -> None:
        del self._bytes
        try:
            self._mm.close()
        except BufferError:  # a view is still alive (in an exception's traceback): the GC unmaps it later
            pass


def uses_importance(p: Planned) -> bool:
    """Whether the output type's encoder takes importance weights (a float type takes none)."""
    return p.out_traits.is_quantized and takes_importance(p.out_traits)


def convert_rows(p: Planned, src: np.ndarray, bar, importance: np.ndarray | None = None) -> np.ndarray:
    """Decode the rows to float32 and encode them in the output type, a slab of rows at a time.
    importance: (n_experts, n_cols) weights (rows of expert e are e * ne[1] ..), for an encoder taking them."""
    n_rows, ncols = src.shape[0], p.desc.ne[0]
    out = np.empty((n_rows, p.out_traits.row_bytes(ncols)), dtype=np.uint8)
    step = max(1, SLAB_FLOATS // max(ncols, 1))
    per_expert = p.desc.ne[1] if len(p.desc.ne) > 1 else 1
    r0 = 0
    while r0 < n_rows:
        r1 = min(n_rows, r0 + step)
        if importance is not None:   # a slab never spans two experts' weights
            r1 = min(r1, (r0 // per_expert + 1) * per_expert)
        try:
            qw = None if importance is None else importance[r0 // per_expert]
            out[r0:r1] = quantize(dequantize(src[r0:r1], p.in_traits), p.out_traits, qw)
            _check_finite(out[r0:r1], p.out_traits)
        except QuantizationError as exc:
            raise QuantizationError(f"tensor {p.desc.name!r} ({p.desc.type_name} -> {p.choice.type_name}), "
                                    f"rows {r0}..{r1 - 1}: {exc}") from exc
        bar.update(src[r0:r1].nbytes)
        r0 = r1
    return out


_SCALE_FIELDS = ("d", "m", "dmin")


def _check_finite(rows: np.ndarray, traits: TypeTraits) -> None:
    """Refuse what ggml_validate_row_data refuses: inf/NaN values or fp16 block scales.

    Weights too large for the type's fp16 scales (|x| beyond ~1e6 for Q2_K, 65504 for F16) overflow to
    inf; llama-quantize stops there ("quantized data validation failed") rather than write them.
    """
    if traits.block_dtype is not None:
        blocks = rows.reshape(-1).view(traits.block_dtype)
        scales = [blocks[f] for f in _SCALE_FIELDS if f in blocks.dtype.names and blocks.dtype[f] == np.float16]
        ok = all(np.isfinite(s).all() for s in scales)
    elif traits.name == "BF16":
        ok = not ((rows.reshape(-1).view(np.uint16) & 0x7FFF) >= 0x7F80).any()
    elif traits.numpy_dtype is not None and np.dtype(traits.numpy_dtype).kind == "f":
        ok = np.isfinite(rows.reshape(-1).view(traits.numpy_dtype)).all()
    else:
        return  # a type this check knows nothing of
    if not ok:
        raise QuantizationError(f"the values overflow {traits.name} (an inf or NaN scale or value); "
                                "llama.cpp refuses them too ('quantized data validation failed')")
