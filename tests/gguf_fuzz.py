"""A seeded GGUF mutator: hostile variants of a valid file, and a runner that says how ggflow took each.

A seed file is read into an editable image (metadata with its GGUF types, tensor infos, the data
section), one strategy mutates the image or its serialized bytes, and the mutant is written back.
The same (seed file, strategy, case number) always gives the same mutant, so a failure found by
benchmarks/fuzz_gguf.py can be replayed and pinned as a test.

Generic strategies damage the container (bytes, counts, offsets, types, dims, truncation); the
type-confusion strategy gives one metadata key a value of another GGUF type. ``run_case`` loads a
mutant and runs what a user would (tokenize, two decoded tokens, a chat template render) under a time
budget: the outcome is "ran", "clean" (a ggflow.errors exception), or "other" (anything else: the
loader's bug).
"""
from __future__ import annotations

import math
import random
import signal
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ggflow.core.gguf_file import ARRAY, STRING, GGUFFile
from ggflow.errors import GGFlowError
from tests.data_dir import DATA

SHARED = DATA
MODEL_SEEDS = sorted((SHARED / "models").glob("tiny-*.gguf"))
VOCAB_SEEDS = sorted((SHARED / "vocab").glob("ggml-vocab-*.gguf"))

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12
_FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
            U64: "Q", I64: "q", F64: "d"}
_DTYPES = {U8: "<u1", I8: "<i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4", F32: "<f4", BOOL: "?",
           U64: "<u8", I64: "<i8", F64: "<f8"}
HUGE_INTS = (2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


# -- the editable image ----------------------------------------------------------------------------
@dataclass
class KV:
    key: str
    vtype: int
    value: Any                   # a scalar, a str, a numpy array, or a list of str
    itype: int | None = None     # the element type of an array
    count: int | None = None     # the array length written (None: the real one); lies make huge arrays


@dataclass
class TensorRec:
    name: str
    ne: list[int]
    type_id: int
    offset: int                  # relative to the data section, as stored
    n_dims: int | None = None    # the count written (None: len(ne))


@dataclass
class Image:
    version: int
    kvs: list[KV]
    tensors: list[TensorRec]
    data: bytes                  # the tensor data section
    n_kv: int | None = None      # the counts written (None: the real ones)
    n_tensors: int | None = None
    alignment: int = 32

    def kv(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    @property
    def arch(self) -> str:
        kv = self.kv("general.architecture")
        return kv.value if kv is not None and isinstance(kv.value, str) else ""


@lru_cache(maxsize=None)
def _read_image(path: Path) -> Image:
    f = GGUFFile(path)
    kvs = [KV(k, f.types[k][0], v, f.types[k][1]) for k, v in f.fields.items()]
    tensors = [TensorRec(t.name, list(t.ne), t.type_id, t.offset - f.data_start) for t in f.tensors]
    return Image(f.version, kvs, tensors, bytes(f.data()[f.data_start:]), alignment=f.alignment)


def read_image(path: str | Path) -> Image:
    """An editable image of a GGUF file (read once per file; each call returns a fresh copy to mutate)."""
    img = _read_image(Path(path))
    return replace(img, kvs=[replace(kv) for kv in img.kvs],
                   tensors=[replace(t, ne=list(t.ne)) for t in img.tensors])


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value: Any, itype: int | None = None, count: int | None = None) -> bytes:
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        n = len(value) if count is None else count
        head = struct.pack("<IQ", itype, n)
        if itype == STRING:
            return head + b"".join(_string(s) for s in value)
        return head + np.asarray(value).astype(_DTYPES[itype]).tobytes()
    return struct.pack("<" + _FORMATS[vtype], value)


def serialize(img: Image) -> bytes:
    out = [b"GGUF", struct.pack("<IQQ", img.version, len(img.tensors) if img.n_tensors is None else img.n_tensors,
                                len(img.kvs) if img.n_kv is None else img.n_kv)]
    for kv in img.kvs:
        out += [_string(kv.key), struct.pack("<I", kv.vtype), _value(kv.vtype, kv.value, kv.itype, kv.count)]
    for t in img.tensors:
        n_dims = len(t.ne) if t.n_dims is None else t.n_dims
        out += [_string(t.name), struct.pack("<I", n_dims), struct.pack(f"<{len(t.ne)}Q", *t.ne),
                struct.pack("<IQ", t.type_id, t.offset)]
    header = b"".join(out)
    pad = -len(header) % img.alignment
    return header + b"\0" * pad + img.data


# -- strategies ------------------------------------------------------------------------------------
# A strategy takes (image, rng) and returns the mutant's bytes.
Strategy = Callable[[Image, random.Random], bytes]


def _header_len(img: Image) -> int:
    return len(serialize(replace(img, data=b"")))


def byte_flips(img: Image, rng: random.Random) -> bytes:
    data = bytearray(serialize(img))
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(_header_len(img))
        data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


def header_huge_ints(img: Image, rng: random.Random) -> bytes:
    data = bytearray(serialize(img))
    width = rng.choice((4, 8))
    i = rng.randrange(4, _header_len(img) - width)
    data[i:i + width] = (rng.choice(HUGE_INTS) % 2 ** (8 * width)).to_bytes(width, "little")
    return bytes(data)


def truncation(img: Image, rng: random.Random) -> bytes:
    data = serialize(img)
    cut = rng.randrange(_header_len(img)) if rng.random() < 0.7 else rng.randrange(len(data))
    return data[:cut]


def tensor_type_ids(img: Image, rng: random.Random) -> bytes:
    t = rng.choice(img.tensors)
    t.type_id = rng.choice((*range(0, 42), 2**31, 2**32 - 1))
    return serialize(img)


def tensor_dims(img: Image, rng: random.Random) -> bytes:
    t = rng.choice(img.tensors)
    how = rng.randrange(4)
    if how == 0:
        t.ne[rng.randrange(len(t.ne))] = rng.choice((0, 1, 3, *HUGE_INTS))
    elif how == 1:
        t.ne = t.ne[::-1] + [1] * rng.randrange(3)
    elif how == 2:
        t.n_dims = rng.choice((0, 5, 2**32 - 1))          # a count that disagrees with the dims written
    else:
        t.ne = [n * rng.choice((2, 3)) for n in t.ne]
    return serialize(img)


def data_offsets(img: Image, rng: random.Random) -> bytes:
    t = rng.choice(img.tensors)
    t.offset = rng.choice((t.offset + 1, t.offset + 32, len(img.data), len(img.data) - 32, *HUGE_INTS))
    return serialize(img)


def architecture_name(img: Image, rng: random.Random) -> bytes:
    names = ("", "llama", "qwen2", "qwen3", "gpt2", "mamba", "llama\0", "LLAMA", "x" * 5000, "ll ama")
    kv = img.kv("general.architecture")
    kv.value = rng.choice(names)
    return serialize(img)


def missing_keys(img: Image, rng: random.Random) -> bytes:
    important = [kv for kv in img.kvs if kv.key.startswith((img.arch + ".", "tokenizer.", "general.a"))]
    img.kvs.remove(rng.choice(important or img.kvs))
    return serialize(img)


def huge_array_lengths(img: Image, rng: random.Random) -> bytes:
    arrays = [kv for kv in img.kvs if kv.vtype == ARRAY]
    kv = rng.choice(arrays)
    kv.count = rng.choice((len(kv.value) + 1, len(kv.value) * 1000, *HUGE_INTS))
    return serialize(img)


def header_counts(img: Image, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        img.n_kv = rng.choice((0, max(0, len(img.kvs) - 1), len(img.kvs) + 1, *HUGE_INTS))
    else:
        img.n_tensors = rng.choice((0, max(0, len(img.tensors) - 1), len(img.tensors) + 1, *HUGE_INTS))
    return serialize(img)


def versions(img: Image, rng: random.Random) -> bytes:
    img.version = rng.choice((0, 1, 4, 255, 2**24 * 3, 2**32 - 1))
    return serialize(img)


def tokenizer_lengths(img: Image, rng: random.Random) -> bytes:
    """Per-token arrays of another length than the tokens; a vocab_size that disagrees with them."""
    names = [k for k in ("tokens", "scores", "token_type", "merges") if img.kv("tokenizer.ggml." + k)]
    vocab_size = img.kv(img.arch + ".vocab_size")
    choice = rng.choice(names + (["vocab_size"] if vocab_size else []))
    if choice == "vocab_size":
        vocab_size.value = max(0, vocab_size.value + rng.choice((-1, 1, -10, 1000)))
    else:
        kv = img.kv("tokenizer.ggml." + choice)
        n = len(kv.value)
        new_n = rng.choice((0, 1, n // 2, n - 1, n + 1, 2 * n))
        if new_n <= n:
            kv.value = kv.value[:new_n]
        else:
            pad = [f"<extra_{i}>" for i in range(new_n - n)]
            kv.value = kv.value + pad if isinstance(kv.value, list) else np.concatenate(
                [kv.value, np.resize(kv.value, new_n - n)])
    return serialize(img)


def duplicates(img: Image, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        img.kvs.append(replace(rng.choice(img.kvs)))
    elif img.tensors:
        img.tensors.append(replace(rng.choice(img.tensors)))
    return serialize(img)


GENERIC: dict[str, Strategy] = {
    "byte_flips": byte_flips, "header_huge_ints": header_huge_ints, "truncation": truncation,
    "tensor_type_ids": tensor_type_ids, "tensor_dims": tensor_dims, "data_offsets": data_offsets,
    "architecture_name": architecture_name, "missing_keys": missing_keys,
    "huge_array_lengths": huge_array_lengths, "header_counts": header_counts, "versions": versions,
    "tokenizer_lengths": tokenizer_lengths, "duplicates": duplicates,
}
# tensor strategies need tensors (a vocab-only file has none)
NEEDS_TENSORS = {"tensor_type_ids", "tensor_dims", "data_offsets"}


# -- type confusion: every key given a value of every other type -------------------------------------
CONFUSIONS: tuple[tuple[str, int, Any, int | None], ...] = (
    ("str", STRING, "abc", None),
    ("empty_str", STRING, "", None),
    ("u32", U32, 7, None),
    ("u32_zero", U32, 0, None),
    ("i32_neg", I32, -1, None),
    ("i64_min", I64, -2**63, None),
    ("u64_2^63", U64, 2**63, None),
    ("u64_max", U64, 2**64 - 1, None),
    ("f32_nan", F32, math.nan, None),
    ("f32_inf", F32, math.inf, None),
    ("f64_big", F64, 1e300, None),
    ("bool", BOOL, True, None),
    ("arr_u32", ARRAY, np.array([1, 2, 3]), U32),
    ("arr_str", ARRAY, ["a", "b"], STRING),
    ("arr_empty", ARRAY, np.array([], np.float32), F32),
)


def type_confusions(img: Image) -> Iterator[tuple[str, str, Image]]:
    """(key, confusion name, mutant image) for every key of the image and every type it is not."""
    for i, kv in enumerate(img.kvs):
        for name, vtype, value, itype in CONFUSIONS:
            if vtype == kv.vtype and itype == kv.itype:
                continue
            kvs = list(img.kvs)
            kvs[i] = KV(kv.key, vtype, value, itype)
            yield kv.key, name, replace(img, kvs=kvs)


def mutate(seed: Path, strategy: str, case: int) -> bytes:
    """The mutant number ``case`` of ``seed`` under a generic strategy (deterministic)."""
    rng = random.Random(f"{seed.name}/{strategy}/{case}")
    return GENERIC[strategy](read_image(seed), rng)


# -- running a mutant ------------------------------------------------------------------------------
class CaseTimeout(BaseException):
    """A case ran past its time budget (a BaseException, so no `except Exception` in ggflow hides it)."""


class _Compiling:
    """Whether numba is compiling now: a first use of a kernel (a mutant may give a tensor a type whose
    kernels have not run yet) takes longer than a case may, and is not the case's doing."""
    depth = 0
    listener = None

    @classmethod
    def install(cls) -> None:
        if cls.listener is None:
            from numba.core import event

            class Listener(event.Listener):
                def on_start(self, ev):
                    cls.depth += 1

                def on_end(self, ev):
                    cls.depth -= 1
            cls.listener = Listener()
            event.register("numba:compile", cls.listener)


@contextmanager
def time_budget(seconds: float):
    """Raise CaseTimeout in the block after ``seconds`` (not counting numba compiling kernels)."""
    _Compiling.install()

    def expire(signum, frame):
        if _Compiling.depth > 0:   # a compile: look again in a second
            signal.setitimer(signal.ITIMER_REAL, 1.0)
            return
        raise CaseTimeout(f"ran past its {seconds} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    kind: str                    # "ran", "clean", "other"
    detail: str = ""


def exercise_model(path: Path) -> None:
    """What a user does first with a model: load, tokenize, decode two tokens, render a chat prompt."""
    from ggflow.core.batch import Batch
    from ggflow.core.chat_template import ChatTemplate
    from ggflow.core.context import Context
    from ggflow.core.model import Model

    model = Model.load(path)
    vocab = model.vocab
    ids = (vocab.tokenize("Hello world", add_special=False) + [0, 0])[:2]
    ctx = Context(model, n_ctx=8, n_threads=1, backends="cpu")
    ctx.decode(Batch.from_tokens(ids))
    vocab.detokenize(ids)
    template = ChatTemplate.for_vocab(model.metadata.get("tokenizer.chat_template"), vocab)
    template.render([{"role": "user", "content": "Hi"}])


def exercise_vocab(path: Path) -> None:
    from ggflow.core.vocab import Vocab

    vocab = Vocab.from_file(path)
    vocab.detokenize(vocab.tokenize("Hello world, 123 héllo"))


def run_case(data: bytes, path: Path, vocab_only: bool = False, budget_s: float = 5.0) -> Outcome:
    """Write the mutant to ``path`` and exercise it; never raises (but for KeyboardInterrupt)."""
    path.write_bytes(data)
    try:
        with time_budget(budget_s):
            (exercise_vocab if vocab_only else exercise_model)(path)
    except GGFlowError as exc:
        return Outcome("clean", f"{type(exc).__name__}: {exc}"[:300])
    except CaseTimeout as exc:
        return Outcome("other", f"hang: {exc}")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 -- counting these is the point
        return Outcome("other", f"{type(exc).__name__}: {exc}"[:300])
    return Outcome("ran")


@dataclass
class Tally:
    cases: int = 0
    clean: int = 0
    ran: int = 0
    other: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome, label: str) -> None:
        self.cases += 1
        setattr(self, outcome.kind, getattr(self, outcome.kind) + 1)
        if outcome.kind == "other" and len(self.examples) < 5:
            self.examples.append(f"{label}: {outcome.detail}")
