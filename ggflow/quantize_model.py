"""Rewrite a GGUF model in another quantization mix, as llama-quantize does.

Each tensor gets the type llama.cpp's rules give it (ggflow/quant_mixes.py). A tensor whose type
changes is decoded to float32 with ggflow.dequantize and encoded with ggflow.quantize, which write
the bytes ggml's reference quantizers write, so a tensor that llama-quantize (without an importance
matrix) would produce from the same input has the same bytes. Metadata is copied with its value
types, general.file_type and general.quantization_version are set, and tensors keep their order,
names, shapes and the file's alignment.

One tensor is in memory at a time, and it is converted in slabs of rows, so peak memory is about
one output tensor plus one float32 slab. The output is written to a temporary file beside OUT and
renamed over OUT only once it is complete: an error or Ctrl-C leaves OUT as it was.
"""
from __future__ import annotations

import mmap
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ggflow.core.quants import dequantize, quantize
from ggflow.core.types import TypeTraits, type_traits
from ggflow.errors import GGFlowError, ModelLoadError, QuantizationError
from ggflow.quant_mixes import Mix, ModelFacts, TensorDesc, TypeChoice, choose_types, find_mix

GGML_QNT_VERSION = 2  # ggml.h: the quantized formats' version, written to general.quantization_version
SLAB_FLOATS = 1 << 24  # float32 elements converted at once (64 MiB): bounds memory on huge tensors
# Keys llama-quantize drops (an output is one file) or rewrites (appended at the end, as gguf_set_val does).
_DROPPED_KEYS = ("split.no", "split.count", "split.tensors.count")
_REWRITTEN_KEYS = ("general.quantization_version", "general.file_type")


@dataclass(frozen=True)
class TensorResult:
    name: str
    ne: tuple[int, ...]
    in_type: str
    out_type: str
    action: str                # "copied", "converted" (from a float type) or "requantized" (from a quantized one)
    fallback_from: str | None  # the type the mix wanted, where the row length forced out_type instead
    in_bytes: int
    out_bytes: int


@dataclass
class QuantizeReport:
    in_path: str
    out_path: str
    mix: str
    ftype: int
    pure: bool
    tensors: list[TensorResult] = field(default_factory=list)
    in_size: int = 0   # file sizes in bytes
    out_size: int = 0
    seconds: float = 0.0

    @property
    def type_counts(self) -> dict[str, int]:
        """Output type -> number of tensors, most frequent first."""
        return dict(Counter(t.out_type for t in self.tensors).most_common())

    @property
    def requantized(self) -> list[str]:
        """Tensors decoded from a quantized input type and quantized again (their errors add up)."""
        return [t.name for t in self.tensors if t.action == "requantized"]

    @property
    def fallbacks(self) -> list[TensorResult]:
        return [t for t in self.tensors if t.fallback_from]

    @property
    def n_elements(self) -> int:
        return sum(int(np.prod(t.ne)) for t in self.tensors)

    def summary(self) -> str:
        mib = 1024 * 1024
        weights_in = sum(t.in_bytes for t in self.tensors)
        weights_out = sum(t.out_bytes for t in self.tensors)
        n = max(self.n_elements, 1)
        lines = [
            f"{self.in_path} -> {self.out_path}: {self.mix}{' (pure)' if self.pure else ''}, "
            f"general.file_type {self.ftype}, {self.seconds:.2f} s",
            f"  file size: {self.in_size / mib:.2f} MiB -> {self.out_size / mib:.2f} MiB",
            f"  weights:   {weights_in / mib:.2f} MiB ({weights_in * 8 / n:.2f} bits/weight) -> "
            f"{weights_out / mib:.2f} MiB ({weights_out * 8 / n:.2f} bits/weight)",
            f"  tensors:   {len(self.tensors)}: " + ", ".join(f"{k} {v}" for k, v in self.type_counts.items()),
        ]
        if self.fallbacks:
            lines.append(f"  fallback:  {len(self.fallbacks)} tensor(s) whose rows don't fit the mix's block got "
                         "another type: " + ", ".join(f"{t.name} {t.fallback_from}->{t.out_type}"
                                                      for t in self.fallbacks))
        if self.requantized:
            lines.append(f"  note: {len(self.requantized)} tensor(s) were already quantized and were requantized "
                         "(decoded, then quantized again: the errors of both add up): " + ", ".join(self.requantized))
        return "\n".join(lines)


@dataclass(frozen=True)
class _Planned:
    """One input tensor and what becomes of it."""
    tensor: gguf.ReaderTensor
    desc: TensorDesc
    choice: TypeChoice
    in_traits: TypeTraits | None   # None for a type ggflow doesn't know (only copying it is possible)
    out_traits: TypeTraits | None

    @property
    def converts(self) -> bool:
        return self.choice.type_name != self.desc.type_name

    @property
    def out_bytes(self) -> int:
        if not self.converts:
            return int(self.tensor.n_bytes)
        return self.out_traits.row_bytes(self.desc.ne[0]) * _n_rows(self.desc.ne)


def quantize_model(in_path: str | os.PathLike, out_path: str | os.PathLike, ftype: str, pure: bool = False,
                   progress: bool = True) -> QuantizeReport:
    """Write in_path's model to out_path in the llama.cpp mix `ftype` ("Q4_K_M", "Q8_0", "F16", ...).

    pure: every quantizable tensor in the mix's base type (no promotions; a row that doesn't fit the
    block still falls back). Raises UnknownNameError for an unknown mix, ModelLoadError for an input
    that is missing or not a readable GGUF file, QuantizationError for a tensor that can't be converted.
    """
    start = time.perf_counter()
    mix = find_mix(ftype)
    in_path, out_path = str(in_path), Path(out_path)
    reader = open_input(in_path)
    facts = _model_facts(reader, in_path)
    plan = _plan(reader, mix, facts, pure)
    _check_output_path(out_path)
    report = QuantizeReport(in_path, str(out_path), mix.name, mix.ftype, pure, in_size=os.path.getsize(in_path))
    tmp = out_path.with_name(f".{out_path.name}.{uuid.uuid4().hex[:12]}.tmp")
    writer = _Writer(str(tmp), facts.arch)  # opens no file until its header is written
    try:
        _write_header(writer, reader, mix, plan)
        report.tensors = _write_tensors(writer, in_path, plan, mix, progress)
        writer.close()
        _fsync(tmp)
        os.replace(tmp, out_path)
    except BaseException:  # Ctrl-C too: never leave a partial file behind
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    report.out_size = os.path.getsize(out_path)  # in_size was taken before: OUT may have replaced IN
    report.seconds = time.perf_counter() - start
    return report


# -- reading ---------------------------------------------------------------------------------------
def open_input(path: str) -> gguf.GGUFReader:
    """The input memory-mapped; a missing, truncated or malformed file is a ModelLoadError naming it."""
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such model file")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # gguf raises ValueError, IndexError, struct errors... on bad files
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    size = os.path.getsize(path)
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise ModelLoadError(f"{path}: tensor {t.name!r} ends at byte {int(t.data_offset) + int(t.n_bytes)} "
                                 f"but the file has {size} bytes (truncated?)")
    return reader


def _metadata(reader: gguf.GGUFReader, path: str, key: str, default: Any = None) -> Any:
    fld = reader.fields.get(key)
    if fld is None:
        return default
    try:
        return fld.contents()
    except Exception as exc:  # a malformed value in an otherwise readable file
        raise ModelLoadError(f"{path}: metadata key {key!r} is unreadable: {exc}") from exc


def _model_facts(reader: gguf.GGUFReader, path: str) -> ModelFacts:
    arch = _metadata(reader, path, "general.architecture")
    if not arch:
        raise ModelLoadError(f"{path}: general.architecture is missing")
    n_layer = _metadata(reader, path, f"{arch}.block_count")
    if n_layer is None:
        raise ModelLoadError(f"{path}: required metadata key '{arch}.block_count' is missing")
    n_head = _first(_metadata(reader, path, f"{arch}.attention.head_count", 0))
    n_expert = int(_metadata(reader, path, f"{arch}.expert_count", 0) or 0)
    return ModelFacts(arch=str(arch), n_layer=int(n_layer), n_head=n_head,
                      n_head_kv=_first(_metadata(reader, path, f"{arch}.attention.head_count_kv", n_head)),
                      n_expert=n_expert if n_expert > 1 else 0)


def _first(value: Any) -> int:
    """Per-layer hparams may be arrays; the rules read layer 0's value, as llama.cpp's n_gqa() does."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else 0
    return int(value)


def _plan(reader: gguf.GGUFReader, mix: Mix, facts: ModelFacts, pure: bool) -> list[_Planned]:
    descs = [TensorDesc(t.name, tuple(int(n) for n in t.shape), t.tensor_type.name) for t in reader.tensors]
    choices = choose_types(descs, mix, facts, pure)
    plan = []
    for t, desc in zip(reader.tensors, descs):
        choice = choices[desc.name]
        in_traits = _known_type(desc.type_name)
        out_traits = _known_type(choice.type_name)
        if choice.type_name != desc.type_name and (in_traits is None or in_traits.to_float is None):
            raise QuantizationError(f"tensor {desc.name!r} is {desc.type_name}, which ggflow cannot decode, "
                                    f"so it cannot become {choice.type_name}")
        plan.append(_Planned(t, desc, choice, in_traits, out_traits))
    return plan


def _known_type(name: str) -> TypeTraits | None:
    try:
        return type_traits(name)
    except GGFlowError:
        return None


def _n_rows(ne: tuple[int, ...]) -> int:
    return int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1


def _check_output_path(out_path: Path) -> None:
    parent = out_path.parent
    if not parent.is_dir():
        raise GGFlowError(f"{out_path}: cannot write there, the directory {parent} does not exist")
    if out_path.is_dir():
        raise GGFlowError(f"{out_path} is a directory; give the output file's name")


# -- planning and writing -------------------------------------------------------------------------------------
def _write_header(writer: gguf.GGUFWriter, reader: gguf.GGUFReader, mix: Mix, plan: list[_Planned]) -> None:
    """Write the metadata and the tensor infos: the writer is then ready for tensor data."""
    writer.data_alignment = reader.alignment
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture",) + _DROPPED_KEYS + _REWRITTEN_KEYS:
            continue  # GGUF.*: the reader's view of the header; the architecture: the writer's first key
        writer.add_key_value(key, *_field_value(reader, key, fld))
    writer.add_uint32("general.quantization_version", GGML_QNT_VERSION)
    writer.add_uint32("general.file_type", mix.ftype)
    for p in plan:
        out_type = gguf.GGMLQuantizationType[p.choice.type_name]
        row_bytes = p.out_bytes // _n_rows(p.desc.ne)
        byte_shape = [*reversed(p.desc.ne[1:]), row_bytes]  # numpy order, last axis in bytes
        writer.add_tensor_info(p.desc.name, byte_shape, np.dtype(np.uint8), p.out_bytes, raw_dtype=out_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()


def _field_value(reader: gguf.GGUFReader, key: str, fld: Any) -> tuple[Any, Any, Any]:
    """(value, type, element type) of a metadata field, strings as raw bytes (no UTF-8 round trip)."""
    GGUFValueType = gguf.GGUFValueType
    vtype = fld.types[0]
    if vtype == GGUFValueType.STRING:
        return bytes(fld.parts[fld.data[0]]), vtype, None
    if vtype != GGUFValueType.ARRAY:
        return fld.parts[fld.data[0]].tolist()[0], vtype, None
    # parts: key length, key, value type, then the array's element type and length, then the items
    sub = GGUFValueType(int(fld.parts[3][0]))
    if sub == GGUFValueType.ARRAY:
        raise ModelLoadError(f"{reader.path}: metadata key {key!r} is an array of arrays, which ggflow "
                             "cannot copy")
    if sub == GGUFValueType.STRING:
        return [bytes(fld.parts[i]) for i in fld.data], vtype, sub
    items = np.concatenate([fld.parts[i] for i in fld.data]).tolist() if fld.data else []
    return items, vtype, sub


def _write_tensors(writer: gguf.GGUFWriter, in_path: str, plan: list[_Planned], mix: Mix,
                   progress: bool) -> list[TensorResult]:
    from tqdm import tqdm

    results = []
    total = sum(int(p.tensor.n_bytes) for p in plan)
    with _InputData(in_path) as data, tqdm(total=total, unit="B", unit_scale=True, desc=f"quantizing to {mix.name}",
                                            file=sys.stderr, disable=not progress, leave=False) as bar:
        for p in plan:
            bar.set_postfix_str(p.desc.name, refresh=False)
            offset, n = int(p.tensor.data_offset), int(p.tensor.n_bytes)
            src = data.rows(offset, n, _n_rows(p.desc.ne))
            writer.write_tensor_data(_convert(p, src, bar) if p.converts else src)
            if not p.converts:
                bar.update(n)
            del src
            data.release(offset, n)
            results.append(_result(p))
    return results


class _InputData:
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

    def __enter__(self) -> "_InputData":
        return self

    def __exit__(self, *exc: Any) -> None:
        del self._bytes
        try:
            self._mm.close()
        except BufferError:  # a view is still alive (in an exception's traceback): the GC unmaps it later
            pass


def _convert(p: _Planned, src: np.ndarray, bar) -> np.ndarray:
    """Decode the rows to float32 and encode them in the output type, a slab of rows at a time."""
    n_rows, ncols = src.shape[0], p.desc.ne[0]
    out = np.empty((n_rows, p.out_traits.row_bytes(ncols)), dtype=np.uint8)
    step = max(1, SLAB_FLOATS // max(ncols, 1))
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        try:
            out[r0:r1] = quantize(dequantize(src[r0:r1], p.in_traits), p.out_traits)
            _check_finite(out[r0:r1], p.out_traits)
        except QuantizationError as exc:
            raise QuantizationError(f"tensor {p.desc.name!r} ({p.desc.type_name} -> {p.choice.type_name}), "
                                    f"rows {r0}..{r1 - 1}: {exc}") from exc
        bar.update(src[r0:r1].nbytes)
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


def _result(p: _Planned) -> TensorResult:
    if not p.converts:
        action = "copied"
    elif p.in_traits.is_quantized:
        action = "requantized"
    else:
        action = "converted"
    return TensorResult(p.desc.name, p.desc.ne, p.desc.type_name, p.choice.type_name, action,
                        p.choice.fallback_from, int(p.tensor.n_bytes), p.out_bytes)


def _fsync(path: Path) -> None:
    # The rename must not outlive the data: a crash after os.replace would otherwise leave a hole.
    with open(path, "rb") as f:
        os.fsync(f.fileno())


class _Writer(gguf.GGUFWriter):
    """GGUFWriter that also writes empty arrays (GGUF allows them; gguf-py refuses to pack them)."""

    def _pack_val(self, val: Any, vtype: gguf.GGUFValueType, add_vtype: bool,
                  sub_type: gguf.GGUFValueType | None = None) -> bytes:
        if vtype == gguf.GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)
