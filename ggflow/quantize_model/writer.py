"""The output GGUF file, written as ggml's gguf_write does (GGUF v3, little-endian).

Metadata is copied as the input stores it, entry by entry (key, value type, value): value types,
non-UTF-8 strings and empty arrays survive without a decode/encode round trip. llama-quantize's
changes: the split keys go (the output is one file), general.file_type and
general.quantization_version are set (appended at the end, as gguf_set_val appends a new key), and
general.architecture comes first. A type llama.cpp has no file type for (a plugin's) gets no
general.file_type: llama.cpp's loader then guesses one from the tensors. Tensor infos follow, then the data, each tensor padded to the
input's alignment.

Layout: magic "GGUF", version u32, n_tensors u64, n_kv u64; n_kv (key string, value type u32, value);
n_tensors (name string, n_dims u32, ne u64 x n_dims, type u32, offset u64); padding to the alignment;
the tensor data (offsets relative to its start).
"""
from __future__ import annotations

import struct
from collections import deque
from typing import BinaryIO

import numpy as np

from ggflow.core.gguf_file import GGUFFile
from ggflow.errors import QuantizationError

GGUF_VERSION = 3
GGML_QNT_VERSION = 2   # ggml.h: the quantized formats' version, written to general.quantization_version
_UINT32, _STRING = 4, 8   # GGUF value types
_DROPPED_KEYS = ("split.no", "split.count", "split.tensors.count")
_REWRITTEN_KEYS = ("general.quantization_version", "general.file_type")
_FIRST_KEY = "general.architecture"


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _uint32_entry(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", _UINT32, value)


def metadata_entries(src: GGUFFile, ftype: int | None, extra: list[tuple[str, str | int]] = ()) -> list[bytes]:
    """The output's key-value entries, in order, from the input's. ftype None: no general.file_type.
    extra: (key, str or u32 value) set after it, as llama-quantize sets its kv_overrides (the imatrix's)."""
    rewritten = _REWRITTEN_KEYS + tuple(k for k, _ in extra)
    kept = [k for k in src.kv_spans if k not in _DROPPED_KEYS + rewritten]
    kept.sort(key=lambda k: k != _FIRST_KEY)  # stable: the rest keep the input's order
    set_keys = [_uint32_entry("general.quantization_version", GGML_QNT_VERSION)]
    if ftype is not None:
        set_keys.append(_uint32_entry("general.file_type", ftype))
    for key, value in extra:
        set_keys.append(_string(key) + struct.pack("<I", _STRING) + _string(value) if isinstance(value, str)
                        else _uint32_entry(key, value))
    return [src.kv_entry(k) for k in kept] + set_keys


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


class GGUFOutput:
    """A GGUF file written in one pass: header, then each tensor's data in the order of its info.

    No file is opened before write_header.
    """

    def __init__(self, path: str, alignment: int):
        self.path, self.alignment = path, alignment
        self._f: BinaryIO | None = None
        self._pending: deque[tuple[str, int]] = deque()   # (name, n_bytes) of the tensors still to write

    def write_header(self, entries: list[bytes], tensors: list[tuple[str, tuple[int, ...], int, int]]) -> None:
        """entries: raw key-value entries; tensors: (name, ne, ggml type id, n_bytes) in file order."""
        out = bytearray(b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(entries)))
        for entry in entries:
            out += entry
        offset = 0
        for name, ne, type_id, n_bytes in tensors:
            out += _string(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)
            offset += n_bytes + _pad(n_bytes, self.alignment)
        out += bytes(_pad(len(out), self.alignment))
        self._f = open(self.path, "wb")
        self._f.write(out)
        self._pending = deque((name, n_bytes) for name, _, _, n_bytes in tensors)

    def write_tensor_data(self, data: np.ndarray) -> None:
        name, n_bytes = self._pending.popleft()
        if data.nbytes != n_bytes:  # a bug, not bad input: the header already promised n_bytes
            raise QuantizationError(f"tensor {name!r}: {data.nbytes} bytes of data for {n_bytes} in the header")
        self._f.write(np.ascontiguousarray(data).data)
        self._f.write(bytes(_pad(n_bytes, self.alignment)))

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
