"""Per-tensor type choices the user makes over the mix, as llama-quantize's options make them.

``--tensor-type PATTERN=TYPE`` (repeatable): the first PATTERN, a regular expression searched for
anywhere in the tensor's name (llama.cpp's std::regex_search), that matches a tensor gives it TYPE
instead of the mix's rules; the row-length fallback still applies. ``--output-tensor-type`` and
``--token-embedding-type`` give output.weight and token_embd.weight their type outright.

A TYPE here is any registered tensor type that has a quantizer (``from_float``): ggflow's own or a
plugin's. llama-quantize lowercases PATTERN (tensor names are lowercase); ggflow matches it ignoring
case instead, which is the same for every name without turning ``\\D`` into ``\\d``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from ggflow.errors import ArgumentError, UnknownNameError


def writable_types() -> list[str]:
    """The registered tensor types a model's weights can be written in, in registration order.

    ggml's integer types (I8 to I64: token ids, positions) may have an encoder too, but a weight in
    them would be truncated to whole numbers, so they are left out.
    """
    from ggflow.plugins.manager import get_plugin_manager

    names = []
    for reg in get_plugin_manager().quant_types:
        traits = reg.obj
        if traits.from_float is not None and not _INTEGER.fullmatch(traits.name) and traits.name not in names:
            names.append(traits.name)
    return names


_INTEGER = re.compile(r"I\d+")


def find_writable_type(name: str) -> str | None:
    """The registered name of a writable type given in any case, or None."""
    key = str(name).strip().upper()
    return key if key in writable_types() else None


def writable_type(name: str, what: str) -> str:
    """find_writable_type, or an UnknownTypeError that says which option had the bad name."""
    found = find_writable_type(name)
    if found is None:
        raise UnknownTypeError(str(name), what)
    return found


class UnknownTypeError(UnknownNameError):
    """A TYPE given to an override that is no registered type with a quantizer."""

    def __init__(self, name: str, what: str):
        types = writable_types()
        super().__init__("tensor type", name, types)
        self.args = (f"unknown tensor type {name!r} in {what}; types with a quantizer: {', '.join(types)}",)


@dataclass(frozen=True)
class TensorTypeRule:
    pattern: str       # as given
    regex: re.Pattern
    type_name: str


@dataclass(frozen=True)
class TypeOverrides:
    tensor_types: tuple[TensorTypeRule, ...] = ()
    output_type: str | None = None           # --output-tensor-type
    token_embedding_type: str | None = None  # --token-embedding-type

    def tensor_type_for(self, name: str) -> str | None:
        """The TYPE of the first --tensor-type rule whose PATTERN occurs in name (llama.cpp: the first wins)."""
        for rule in self.tensor_types:
            if rule.regex.search(name):
                return rule.type_name
        return None


NO_OVERRIDES = TypeOverrides()

TensorTypes = Mapping[str, str] | Iterable["str | tuple[str, str]"]


def split_tensor_type(text: str) -> tuple[str, str]:
    """'PATTERN=TYPE' -> (PATTERN, TYPE), refused as llama-quantize's parse_tensor_type refuses it."""
    pattern, sep, type_name = str(text).partition("=")
    if not sep:
        raise ArgumentError("tensor_types", text, "'PATTERN=TYPE' (e.g. 'attn_v=Q8_0'): it has no '='")
    if not pattern:
        raise ArgumentError("tensor_types", text, "'PATTERN=TYPE' with a PATTERN before the '='")
    if not type_name:
        raise ArgumentError("tensor_types", text, "'PATTERN=TYPE' with a TYPE after the '='")
    return pattern, type_name


def make_overrides(tensor_types: TensorTypes | None = None, output_tensor_type: str | None = None,
                   token_embedding_type: str | None = None) -> TypeOverrides:
    """Check and compile the user's overrides. tensor_types: {PATTERN: TYPE} (in order), or a sequence
    of 'PATTERN=TYPE' strings or (PATTERN, TYPE) pairs."""
    if tensor_types is None:
        pairs: list[tuple[str, str]] = []
    elif isinstance(tensor_types, Mapping):
        pairs = list(tensor_types.items())
    elif isinstance(tensor_types, str):  # one 'PATTERN=TYPE' passed bare: not a sequence of characters
        pairs = [split_tensor_type(tensor_types)]
    else:
        pairs = [split_tensor_type(item) if isinstance(item, str) else _pair(item) for item in tensor_types]
    rules = tuple(TensorTypeRule(p, _compile(p), writable_type(t, f"tensor_types {p}={t}")) for p, t in pairs)
    return TypeOverrides(
        rules,
        None if output_tensor_type is None else writable_type(output_tensor_type, "output_tensor_type"),
        None if token_embedding_type is None else writable_type(token_embedding_type, "token_embedding_type"))


def _pair(item: object) -> tuple[str, str]:
    if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
        return item
    raise ArgumentError("tensor_types", item, "'PATTERN=TYPE' strings, (PATTERN, TYPE) pairs or a {PATTERN: TYPE} dict")


def _compile(pattern: str) -> re.Pattern:
    if not isinstance(pattern, str) or not pattern:
        raise ArgumentError("tensor_types", pattern, "a non-empty regular expression (PATTERN of PATTERN=TYPE)")
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise ArgumentError("tensor_types", pattern, f"a valid regular expression ({exc})") from None
