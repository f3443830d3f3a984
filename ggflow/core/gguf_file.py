"""A GGUF file's header, read straight from a memory map: metadata, tensor infos, the data section.

gguf.GGUFReader builds a numpy view per array element, which takes seconds for a 49k-150k token
vocabulary before any weight is touched; reading the header with struct and numpy.frombuffer takes
milliseconds. Numeric arrays come back as numpy arrays, string arrays as lists of str, and each
key-value entry's raw bytes stay reachable (kv_entry) for copying metadata as is. The gguf package
stays the reference for the tests.

Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, n_tensors u64, n_kv u64; n_kv
(key string, value type u32, value); n_tensors (name string, n_dims u32, ne u64 x n_dims, type u32,
offset u64); padding to general.alignment (default 32); tensor data at data_start + offset.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ggflow.errors import ModelLoadError

SCALAR_DTYPES = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?",
                 10: "u8", 11: "i8", 12: "f8"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    ne: tuple[int, ...]       # innermost first, as stored
    offset: int               # absolute byte offset of the data in the file


LAZY_ARRAY_MIN = 4096      # elements: a longer array is decoded when read where lazy_arrays is asked for


@dataclass(frozen=True)
class LazyValue:
    at: int                   # where the value starts in the file
    vtype: int
    end: int


class Fields(Mapping):
    """A GGUF file's decoded metadata, key -> value in file order; a LazyValue is decoded on each read."""

    def __init__(self, file: "GGUFFile"):
        self._values: dict[str, Any] = {}
        self._file = weakref.ref(file)   # the file holds its fields: no cycle that would delay closing it

    def put(self, key: str, value: Any) -> None:
        self._values[key] = value

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        return self._file().decode(value) if isinstance(value, LazyValue) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class GGUFFile:
    """The parsed header of a GGUF file and a read-only memory map of all of it."""

    def __init__(self, path: str | os.PathLike, keep: Callable[[str], bool] = lambda key: True,
                 tensors: bool = True, lazy_arrays: bool = False):
        """keep: which metadata keys to decode (others are skipped); tensors: read tensor infos too;
        lazy_arrays: arrays of more than LAZY_ARRAY_MIN elements (a vocabulary's tokens, merges, scores)
        are decoded from the file when read, each time, instead of held (Qwen2's 151,936 tokens and
        merges as Python strings: 30 MiB that a process which never tokenizes, bench, need not hold)."""
        self.path = str(path)
        self._lazy_arrays = lazy_arrays
        self._decoding = threading.Lock()   # decode() moves the parser's position
        if not os.path.isfile(self.path):
            raise ModelLoadError(f"{self.path}: no such file")
        self.size = os.path.getsize(self.path)
        try:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
            # Kept open for pread: rows read from it map no pages (backends_builtin/cpu/ops/file_rows.py).
            self.fileno = os.open(self.path, os.O_RDONLY)
            weakref.finalize(self, os.close, self.fileno)
            self._parse(keep, tensors)
            self.release(0, self.pos)   # the header now lives in self.fields; kv_entry re-reads what it needs
        except ModelLoadError:
            raise
        except (ValueError, OSError, struct.error, IndexError, UnicodeDecodeError, OverflowError) as exc:
            raise ModelLoadError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    # -- parsing ---------------------------------------------------------------------------------
    def _parse(self, keep: Callable[[str], bool], read_tensors: bool) -> None:
        mm = self._mm
        if len(mm) < 24 or mm[:4] != b"GGUF":
            raise ModelLoadError(f"{self.path}: not a GGUF file (it starts with {bytes(mm[:4])!r})")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        if self.version not in (2, 3):
            raise ModelLoadError(f"{self.path}: GGUF version {self.version} is not supported "
                                 "(versions 2 and 3, little-endian, are)")
        self.pos = 24
        self.fields = Fields(self)
        self.types: dict[str, tuple[int, int | None]] = {}   # key -> (GGUF value type, array element type)
        self.kv_spans: dict[str, tuple[int, int]] = {}  # every key, in file order: its entry's bytes
        for _ in range(n_kv):
            start = self.pos
            key = self._string()
            if key in self.kv_spans:   # gguf_init_from_file refuses a duplicated key too
                raise ModelLoadError(f"{self.path}: metadata key {key!r} appears twice")
            (vtype,) = self._unpack("<I")
            itype = struct.unpack_from("<I", mm, self.pos)[0] if vtype == ARRAY else None
            wanted = keep(key) or key == "general.alignment"
            lazy = (wanted and self._lazy_arrays and vtype == ARRAY
                    and struct.unpack_from("<Q", mm, self.pos + 4)[0] > LAZY_ARRAY_MIN)
            value_at = self.pos
            value = self._value(vtype, wanted and not lazy)
            if wanted:
                self.fields.put(key, LazyValue(value_at, vtype, self.pos) if lazy else value)
                self.types[key] = (vtype, itype)
            self.kv_spans[key] = (start, self.pos)
        self.tensors: list[TensorInfo] = []
        if not read_tensors:
            return
        infos, names = [], set()
        for _ in range(n_tensors):
            name = self._string()
            if name in names:
                raise ModelLoadError(f"{self.path}: tensor {name!r} appears twice")
            names.add(name)
            (n_dims,) = self._unpack("<I")
            if n_dims > 4:
                raise ModelLoadError(f"{self.path}: tensor {name!r} has {n_dims} dimensions (at most 4)")
            ne = self._unpack(f"<{n_dims}Q")
            # ggml counts elements in int64: refuse what would overflow it (as gguf_init_from_file does)
            if math.prod(ne) >= 2**63 or any(n >= 2**63 for n in ne):
                raise ModelLoadError(f"{self.path}: tensor {name!r} has shape {list(ne)}: too many elements")
            type_id, offset = self._unpack("<IQ")
            infos.append((name, type_id, tuple(int(n) for n in ne), offset))
        self.alignment = self._alignment()
        self.data_start = -(-self.pos // self.alignment) * self.alignment
        for name, type_id, ne, offset in infos:
            if offset % self.alignment:
                raise ModelLoadError(f"{self.path}: tensor {name!r} data offset {offset} is not aligned")
            self.tensors.append(TensorInfo(name, type_id, ne, self.data_start + offset))

    def _alignment(self) -> int:
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, int):
            raise ModelLoadError(f"{self.path}: metadata key 'general.alignment' must be an integer, "
                                 f"found {type(alignment).__name__} {alignment!r:.40}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ModelLoadError(f"{self.path}: general.alignment {alignment} is not a power of two")
        return alignment

    def _unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self._mm, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self, keep: bool = True) -> str | None:
        (n,) = self._unpack("<Q")
        start, self.pos = self.pos, self.pos + n
        if self.pos > len(self._mm):
            raise IndexError("a string runs past the end of the file")
        return self._mm[start:self.pos].decode("utf-8") if keep else None

    def _value(self, vtype: int, keep: bool) -> Any:
        if vtype == STRING:
            return self._string(keep)
        if vtype in SCALAR_DTYPES:
            dtype = np.dtype(SCALAR_DTYPES[vtype]).newbyteorder("<")
            value = np.frombuffer(self._mm, dtype, 1, self.pos)[0]
            self.pos += dtype.itemsize
            return value.item()
        if vtype == ARRAY:
            itype, count = self._unpack("<IQ")
            if itype == STRING:
                return self._string_array(count, keep)
            if itype not in SCALAR_DTYPES:
                raise ModelLoadError(f"{self.path}: unsupported GGUF array element type {itype}")
            dtype = np.dtype(SCALAR_DTYPES[itype]).newbyteorder("<")
            start, self.pos = self.pos, self.pos + dtype.itemsize * count
            if self.pos > len(self._mm):
                raise IndexError("an array runs past the end of the file")
            return np.frombuffer(self._mm, dtype, count, start).astype(dtype.newbyteorder("=")) if keep else None
        raise ModelLoadError(f"{self.path}: unknown GGUF value type {vtype}")

    def _string_array(self, count: int, keep: bool) -> list[str] | None:
        mm, pos, unpack = self._mm, self.pos, struct.Struct("<Q").unpack_from
        out: list[str] = []
        for _ in range(count):
            (n,) = unpack(mm, pos)
            if keep:
                out.append(mm[pos + 8:pos + 8 + n].decode("utf-8"))
            pos += 8 + n
            if pos > len(mm):
                raise IndexError("a string array runs past the end of the file")
        self.pos = pos
        return out if keep else None

    def decode(self, lazy: "LazyValue") -> Any:
        """A value parse() left in the file (lazy_arrays), decoded now; its pages given back after."""
        with self._decoding:
            saved, self.pos = self.pos, lazy.at
            try:
                return self._value(lazy.vtype, True)
            except (ValueError, struct.error, IndexError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
            finally:
                self.pos = saved
                self.release(lazy.at, lazy.end - lazy.at)

    # -- access ----------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def kv_entry(self, key: str) -> bytes:
        """The key-value entry as the file stores it (key, value type, value): what copying metadata
        byte for byte needs, whatever the value holds (non-UTF-8 strings, empty arrays)."""
        start, end = self.kv_spans[key]
        return bytes(self._mm[start:end])

    def data(self) -> np.ndarray:
        """The whole file as a read-only uint8 array over the memory map (no copy)."""
        return np.frombuffer(self._mm, dtype=np.uint8)

    def release(self, offset: int, nbytes: int) -> int:
        """Give back the resident pages of bytes [offset, offset + nbytes) (the whole pages inside that
        range); returns how many bytes of pages that was.

        For a caller that has copied those bytes (a weight repacked for the kernels): the file's pages
        otherwise stay in the process's RSS for as long as the map lives. The map is read-only and
        file-backed, so nothing is lost: a later read (the token embedding's get_rows, when the output
        matrix shares it) faults its page in again from the page cache.

        MADV_RANDOM first: those later reads are a row here and there, so reading ahead for them is
        waste; and the range becomes a mapping (VMA) of its own. That matters on kernels that map a
        whole large page-cache folio (up to 2 MiB) on one fault: a norm weight that is read in place,
        on a page next to released ones, would otherwise map its neighbours' pages back. The pages at
        the range's two ends may hold a neighbour, so they stay.
        """
        if not isinstance(self._mm, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= start or start >= len(self._mm):
            return 0
        try:
            self._mm.madvise(mmap.MADV_RANDOM, start, end - start)
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except OSError:   # a hint the system refused: the pages just stay
            return 0
        return end - start

    def resident_bytes(self, offset: int = 0, nbytes: int | None = None) -> int | None:
        """How many bytes of the map's pages over [offset, offset + nbytes) this process has resident (the
        present bit of /proc/self/pagemap: pages mapped here, not merely in the page cache, which mincore
        would count); None where the kernel does not say (not Linux)."""
        if not isinstance(self._mm, mmap.mmap):
            return 0
        nbytes = len(self._mm) - offset if nbytes is None else nbytes
        base = np.frombuffer(self._mm, np.uint8).ctypes.data
        first, end = (base + offset) // mmap.PAGESIZE, -(-(base + offset + nbytes) // mmap.PAGESIZE)
        try:
            with open("/proc/self/pagemap", "rb") as f:
                f.seek(first * 8)
                entries = np.frombuffer(f.read((end - first) * 8), np.uint64)
        except OSError:
            return None
        return int(np.count_nonzero(entries >> np.uint64(63))) * mmap.PAGESIZE
