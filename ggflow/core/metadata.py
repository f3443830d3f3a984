"""Metadata: a GGUF file's key/value pairs, read through typed accessors that check type and range.

llama.cpp reads every key through ``llama_model_loader::get_key`` / ``get_arr``, which refuse a value of
the wrong GGUF type ("key %s has wrong type %s but expected type %s") and a missing required key. The
accessors here do the same, and also check the range the value is used in (a block count of 2**63 would
otherwise build a tensor-name table until memory runs out; a NaN epsilon poisons every norm). Each
error names the file, the key, what was expected and what was found.

Integer keys accept any GGUF integer type (writers differ on u32 / i32 / u64 for the same key); a bool
is not an integer, a float is not an integer. Float keys accept integers too, and must be finite.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np

from ggflow.errors import ModelLoadError

# GGUF value type ids (gguf.GGUFValueType) -> names as llama.cpp prints them
GGUF_TYPE_NAMES = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
                   8: "str", 9: "arr", 10: "u64", 11: "i64", 12: "f64"}
_ELEMENT_KINDS = {"int": "iu", "float": "fiu", "bool": "b"}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()   # the default of a key that must be present


def describe_value(value: Any, gguf_type: tuple[int, int | None] | None = None) -> str:
    """What a metadata value is, for an error message: its GGUF type (when known) and a short form of it."""
    if isinstance(value, (list, np.ndarray)):
        elem = "str" if isinstance(value, list) else str(value.dtype)
        if gguf_type is not None and gguf_type[1] is not None:
            elem = GGUF_TYPE_NAMES.get(gguf_type[1], str(gguf_type[1]))
        return f"an array of {len(value)} {elem}"
    kind = GGUF_TYPE_NAMES.get(gguf_type[0], "?") if gguf_type else type(value).__name__
    text = repr(value)
    return f"{kind} {text[:40] + '...' if len(text) > 40 else text}"


class Metadata(Mapping):
    """Typed access to a GGUF file's metadata, with errors that name the file and key.

    ``types`` maps a key to its GGUF (value type, array element type) as GGUFFile read it, so an error
    can say "found u32 7" rather than "found int 7"; without it the Python type is named.
    """

    def __init__(self, fields: Mapping[str, Any], path: str,
                 types: Mapping[str, tuple[int, int | None]] | None = None):
        self.fields, self.path, self.types = fields, path, types or {}
        arch = fields.get("general.architecture", "")
        if not isinstance(arch, str):
            raise self._wrong("general.architecture", "a string", arch)
        self.arch = arch

    @classmethod
    def of(cls, meta: "Mapping[str, Any] | Metadata", path: str) -> "Metadata":
        """``meta`` itself if it is Metadata already, else Metadata over the mapping."""
        return meta if isinstance(meta, Metadata) else cls(meta, path)

    # -- Mapping ---------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value, unchecked (prefer the typed accessors)."""
        return self.fields.get(key, default)

    # -- typed accessors -------------------------------------------------------------------------
    def get_int(self, key: str, default: Any = REQUIRED, *, min: int | None = None, max: int | None = None) -> Any:
        value = self.fields.get(key)
        if value is None:
            return self._missing(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise self._wrong(key, "an integer", value)
        value = int(value)
        self._check_range(key, value, min, max)
        return value

    def get_float(self, key: str, default: Any = REQUIRED, *, min: float | None = None,
                  max: float | None = None) -> Any:
        value = self.fields.get(key)
        if value is None:
            return self._missing(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise self._wrong(key, "a number", value)
        value = float(value)
        if not math.isfinite(value):
            raise self._wrong(key, "a finite number", value)
        self._check_range(key, value, min, max)
        return value

    def get_str(self, key: str, default: Any = REQUIRED) -> Any:
        value = self.fields.get(key)
        if value is None:
            return self._missing(key, default)
        if not isinstance(value, str):
            raise self._wrong(key, "a string", value)
        return value

    def get_bool(self, key: str, default: Any = REQUIRED) -> Any:
        value = self.fields.get(key)
        if value is None:
            return self._missing(key, default)
        if not isinstance(value, (bool, np.bool_)):
            raise self._wrong(key, "a bool", value)
        return bool(value)

    def get_array(self, key: str, elem: str, default: Any = REQUIRED, *, min_len: int = 0) -> Any:
        """A GGUF array of ``elem`` ("str", "int", "float", "bool"): a list of str or a numpy array."""
        value = self.fields.get(key)
        if value is None:
            return self._missing(key, default)
        if elem == "str":
            ok = isinstance(value, list)   # GGUFFile reads string arrays (only) as lists
        else:
            ok = isinstance(value, np.ndarray) and value.dtype.kind in _ELEMENT_KINDS[elem]
        if not ok:
            raise self._wrong(key, f"an array of {elem}", value)
        if len(value) < min_len:
            raise ModelLoadError(f"{self.path}: metadata key {key!r} has {len(value)} entries, "
                                 f"expected at least {min_len}")
        return value

    # -- the architecture's keys -------------------------------------------------------------------
    def arch_key(self, suffix: str) -> str:
        """The full name of a key under the architecture's prefix: arch_key("block_count") -> llama.block_count."""
        return f"{self.arch}.{suffix}"

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        return self.get(self.arch_key(suffix), default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{self.path}: required metadata key {key!r} is missing")
        return value

    def arch_require(self, suffix: str) -> Any:
        return self.require(self.arch_key(suffix))

    # -- errors ----------------------------------------------------------------------------------
    def _missing(self, key: str, default: Any) -> Any:
        if default is REQUIRED:
            raise ModelLoadError(f"{self.path}: required metadata key {key!r} is missing")
        return default

    def _wrong(self, key: str, expected: str, value: Any) -> ModelLoadError:
        found = describe_value(value, self.types.get(key))
        return ModelLoadError(f"{self.path}: metadata key {key!r} must be {expected}, found {found}")

    def _check_range(self, key: str, value: float, lo: float | None, hi: float | None) -> None:
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
            raise ModelLoadError(f"{self.path}: metadata key {key!r} = {value} is outside {bounds}")
