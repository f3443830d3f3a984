"""Importance-matrix files: llama.cpp's GGUF format (written and read) and its legacy ``.dat`` (both too).

GGUF (tools/imatrix/imatrix.cpp ``save_imatrix``, common/imatrix-loader.cpp): ``general.type = "imatrix"``,
``imatrix.datasets`` (the text files' names), ``imatrix.chunk_count`` and ``imatrix.chunk_size`` (u32);
per weight, sorted by name, ``<name>.in_sum2`` F32 [n_cols, n_mat] (raw sums of squared inputs) and
``<name>.counts`` F32 [1, n_mat] (rows summed per matrix). No general.architecture key.

Legacy ``.dat`` (``save_imatrix_legacy``), little-endian: i32 n_entries, then per entry i32 name length,
the name, i32 ncall, i32 nval, nval f32 of ``sum / count * ncall`` (a matrix never seen: 1.0); then,
optional, i32 chunk count, i32 length and the dataset name.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from ggflow.errors import ImatrixError
from ggflow.imatrix.collector import Entry

KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"


@dataclass
class Imatrix:
    entries: dict[str, Entry]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False      # read from a .dat: sums are sum/count*ncall, counts [ncall]
    has_metadata: bool = True    # the GGUF had all three imatrix.* keys (llama-quantize requires them)

    def importance(self, name: str) -> np.ndarray | None:
        """The weights llama-quantize hands the quantizers for tensor `name` (its load_imatrix), flat
        (n_mat * n_cols,) float32: sums / count per matrix (a matrix never seen: all 1); None if absent."""
        e = self.entries.get(name)
        if e is None:
            return None
        if self.is_legacy:
            ncall = int(e.counts[0]) if e.counts.size else 0
            return (e.sums / np.float32(ncall) if ncall > 0 else e.sums.copy()).reshape(-1)
        counts = e.counts.astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(counts > 0, e.sums / np.where(counts > 0, counts, 1), np.float32(1))
        return w.astype(np.float32).reshape(-1)


def chunk_count(entries: dict[str, Entry], chunk_size: int) -> int:
    """llama-imatrix's m_last_chunk: the most rows any matrix saw, in whole chunks."""
    most = max((int(e.counts.max()) for e in entries.values() if e.counts.size), default=0)
    return most // chunk_size if chunk_size > 0 else 0


def write_gguf(path: str | os.PathLike, m: Imatrix) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    w = gguf.GGUFWriter(str(tmp), "")
    w.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE, None)   # llama-imatrix writes none
    w.add_string(gguf.Keys.General.TYPE, "imatrix")
    w.add_array(KEY_DATASETS, list(m.datasets))
    w.add_uint32(KEY_CHUNK_COUNT, m.chunk_count)
    w.add_uint32(KEY_CHUNK_SIZE, m.chunk_size)
    for name in sorted(m.entries):
        e = m.entries[name]
        if e.sums.size and e.counts.size:
            w.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(e.sums, np.float32))
            w.add_tensor(f"{name}.counts", e.counts.astype(np.float32).reshape(-1, 1))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)


def write_dat(path: str | os.PathLike, m: Imatrix) -> None:
    """The legacy format; entries whose matrices were never seen are left out, as llama.cpp does."""
    chunk = max(m.chunk_size, 1)
    parts = []
    names = sorted(n for n, e in m.entries.items() if e.counts.size and e.counts.any())
    for name in names:
        e = m.entries[name]
        ncall = (int(e.counts.max()) + chunk - 1) // chunk
        counts = np.repeat(e.counts.astype(np.float32), e.sums.shape[1])
        values = e.sums.reshape(-1).astype(np.float32)
        seen = counts != 0
        values = np.where(seen, values, np.float32(1)) / np.where(seen, counts, np.float32(1)) * np.float32(ncall)
        raw = name.encode()
        parts += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, values.size),
                  values.astype("<f4").tobytes()]
    dataset = (m.datasets[-1] if m.datasets else "").encode()
    data = b"".join([struct.pack("<i", len(names)), *parts, struct.pack("<ii", m.chunk_count, len(dataset)), dataset])
    Path(path).write_bytes(data)


def read_imatrix(path: str | os.PathLike) -> Imatrix:
    """Either format (GGUF by its magic, else legacy); anything malformed is an ImatrixError naming the file."""
    path = str(path)
    if not os.path.isfile(path):
        raise ImatrixError(f"{path}: no such imatrix file")
    with open(path, "rb") as f:
        magic = f.read(4)
    return _read_gguf(path) if magic == b"GGUF" else _read_dat(path)


def _read_gguf(path: str) -> Imatrix:
    try:
        r = gguf.GGUFReader(path)
    except Exception as exc:   # gguf-py raises ValueError/struct errors of every kind on a damaged file
        raise ImatrixError(f"{path}: not a readable GGUF file ({exc})") from None
    pairs: dict[str, dict[str, object]] = {}
    for t in r.tensors:
        for suffix in ("in_sum2", "counts"):
            if t.name.endswith("." + suffix) and t.name != "." + suffix:
                if t.tensor_type != gguf.GGMLQuantizationType.F32:
                    raise ImatrixError(f"{path}: {t.name} is {t.tensor_type.name}; sums and counts must be F32")
                pairs.setdefault(t.name[:-len(suffix) - 1], {})[suffix] = np.asarray(t.data, np.float32)
    if not r.tensors:
        raise ImatrixError(f"{path}: no data in the file")
    entries = {}
    for name, p in sorted(pairs.items()):
        if len(p) != 2:
            raise ImatrixError(f"{path}: mismatched sums and counts for {name}")
        counts = np.rint(np.asarray(p["counts"]).reshape(-1)).astype(np.int64)   # lround
        sums = np.asarray(p["in_sum2"]).reshape(-1)
        if counts.size == 0 or sums.size % counts.size:
            raise ImatrixError(f"{path}: {name} has {sums.size} sums for {counts.size} counts")
        entries[name] = Entry(sums.reshape(counts.size, -1).copy(), counts)

    def field(key: str):
        f = r.fields.get(key)
        return None if f is None else f.contents()
    datasets, n_chunks, size = field(KEY_DATASETS), field(KEY_CHUNK_COUNT), field(KEY_CHUNK_SIZE)
    return Imatrix(entries, [str(d) for d in datasets] if isinstance(datasets, list) else [],
                   int(n_chunks or 0), int(size or 0), is_legacy=False,
                   has_metadata=None not in (datasets, n_chunks, size))


def _read_dat(path: str) -> Imatrix:
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ImatrixError(f"{path}: neither a GGUF file nor a complete legacy imatrix (.dat) file: "
                               f"it ends at byte {len(data)} inside an entry")
        out = struct.unpack_from(fmt, data, pos)
        pos += size
        return out

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise ImatrixError(f"{path}: no data in file (a legacy imatrix starts with its entry count, here {n_entries})")
    entries = {}
    for i in range(n_entries):
        (n,) = take("<i")
        if not 0 < n <= len(data) - pos:
            raise ImatrixError(f"{path}: entry {i + 1} has a name length of {n}")
        name = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        ncall, nval = take("<ii")
        if nval < 1 or pos + 4 * nval > len(data):
            raise ImatrixError(f"{path}: entry {i + 1} ({name}) has {nval} values, which the file does not hold")
        sums = np.frombuffer(data, "<f4", nval, pos).astype(np.float32).reshape(1, -1)
        pos += 4 * nval
        entries[name] = Entry(sums, np.array([ncall], np.int64))
    n_chunks, datasets = 0, []
    if pos + 4 <= len(data):
        (n_chunks,) = take("<i")
        if pos + 4 <= len(data):
            (n,) = take("<i")
            if 0 < n <= len(data) - pos:
                datasets.append(data[pos:pos + n].decode("utf-8", "replace"))
    return Imatrix(entries, datasets, int(n_chunks), 0, is_legacy=True)
