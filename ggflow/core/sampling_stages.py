"""What a sampler takes, declared once, and the stage lists every door builds a chain from.

A sampler factory declares its parameters as ``params = (SamplerParam("p", float, 0.5, lo=0, hi=1), ...)``
(one without a declaration is described by its ``__init__`` signature: names, defaults, plain types, no
ranges). ``SamplingParams(samplers=...)``, the CLI (``--samplers "top_k;acme_xtc:p=0.5;temperature"``,
``--sampler-param acme_xtc.p=0.5``) and the server (a request's ``samplers`` field) all go through
``sampler_stages``, which checks every name and value against that declaration the same way: an unknown
sampler is an UnknownNameError listing the registered ones, an unknown parameter or a value out of range
an ArgumentError naming what is accepted. See docs/sampling.md, "Plugin samplers' parameters".
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ggflow.errors import ArgumentError

REQUIRED: Any = inspect.Parameter.empty   # a parameter with no default must be given
_TYPES = {"int": int, "float": float, "bool": bool, "str": str}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

# llama.cpp's spellings of the stages (common_sampler_types_from_names) -> the samplers' registered names
STAGE_ALIASES = {
    "typ_p": "typical", "typ": "typical", "typical_p": "typical", "nucleus": "top_p",
    "temperature": "temp_ext", "temp": "temp_ext",
}

Stage = "str | tuple[str, dict[str, Any]]"


@dataclass(frozen=True)
class SamplerParam:
    """One parameter of a sampler: its name, type (int, float, bool, str; ``object``: any value, unchecked),
    default (REQUIRED: none), an optional range (open at an end where ``lo_open`` / ``hi_open``) and a doc."""

    name: str
    type: type = float
    default: Any = REQUIRED
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    doc: str = ""

    def accepted(self) -> str:
        """What the parameter accepts, in words (the error messages and ``ggflow plugins`` show it)."""
        if self.type is object:
            return "any value"
        what = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[self.type]
        if self.lo is not None or self.hi is not None:
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            hi = "inf" if self.hi is None else f"{self.hi:g}"
            what += f" in {'(' if self.lo_open or self.lo is None else '['}{lo}, {hi}" \
                    f"{')' if self.hi_open or self.hi is None else ']'}"
        return what

    def check(self, sampler: str, value: Any) -> Any:
        """The value as the sampler takes it; text (from a command line) is parsed first. ArgumentError
        naming ``sampler.name`` and what it accepts otherwise."""
        label = f"{sampler}.{self.name}"
        if self.type is object:
            return value
        try:
            value = _converted(self.type, value)
        except (TypeError, ValueError):
            raise ArgumentError(label, value, self.accepted()) from None
        if self.type in (int, float):
            if self.type is float and math.isnan(value):
                raise ArgumentError(label, value, self.accepted())
            low_bad = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
            high_bad = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
            if low_bad or high_bad:
                raise ArgumentError(label, value, self.accepted())
        return value


def _converted(kind: type, value: Any) -> Any:
    if kind is bool:
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, bool):
            return value
        raise TypeError(value)
    if isinstance(value, bool):
        raise TypeError(value)   # True is not a number here
    if kind is int:
        if isinstance(value, str):
            return int(value.strip())
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
        raise TypeError(value)
    if kind is float:
        if isinstance(value, (str, int, float)):
            return float(value)
        raise TypeError(value)
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def declared_params(name: str) -> tuple[tuple[SamplerParam, ...], bool]:
    """The parameters of the sampler registered as ``name`` and whether it takes others too (``**kwargs``):
    its ``params`` declaration, else what its ``__init__`` signature says."""
    from ggflow.plugins.manager import get_plugin_manager

    factory = get_plugin_manager().samplers.get(name)
    declared = getattr(factory, "params", None)
    if declared is not None:
        return tuple(declared), False
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return (), True
    params, open_ended = [], False
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            open_ended = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
            params.append(SamplerParam(p.name, _TYPES.get(annotation, object), p.default))
    return tuple(params), open_ended


def check_sampler_params(name: str, values: Mapping[str, Any], *, fill_defaults: bool = False) -> dict[str, Any]:
    """``values`` checked against the declaration of sampler ``name`` (with the declared defaults added
    where ``fill_defaults``): unknown names, missing required ones and bad values are ArgumentErrors."""
    params, open_ended = declared_params(name)
    by_name = {p.name: p for p in params}
    unknown = sorted(set(values) - set(by_name))
    if unknown and not open_ended:
        accepted = ", ".join(f"{p.name} ({p.accepted()})" for p in params) or "no parameters"
        raise ArgumentError(f"{name}.{unknown[0]}", values[unknown[0]], f"one of the parameters {name} takes: "
                                                                         f"{accepted}")
    out = {k: (by_name[k].check(name, v) if k in by_name else v) for k, v in values.items()}
    if fill_defaults:
        for p in params:
            if p.name not in out and p.default is not REQUIRED:
                out[p.name] = p.default
    return out


def stage_name(entry: str) -> str:
    """A stage's registered name, from llama.cpp's spellings (``min-p``, ``temp``, ``typ_p``, ...);
    UnknownNameError listing the registered samplers where none matches."""
    from ggflow.plugins.manager import get_plugin_manager

    registry = get_plugin_manager().samplers
    key = entry.strip().lower().replace("-", "_")
    name = STAGE_ALIASES.get(key, key)
    if name in registry:
        return name
    registry.get(entry.strip())   # raises UnknownNameError("sampler", entry, registered)
    return entry.strip()


def parse_stage(text: str) -> "str | tuple[str, dict[str, str]]":
    """``"top_k"`` or ``"acme_xtc:p=0.5,threshold=0.1"`` (values still text) as a stage entry."""
    name, sep, rest = text.partition(":")
    if not sep:
        return name.strip()
    values: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ArgumentError("samplers", text, "a stage written name or name:param=value[,param=value...]")
        values[key.strip()] = value.strip()
    return name.strip(), values


def parse_samplers(spec: str) -> list:
    """The CLI's ``--samplers`` text: stages separated by ';'."""
    return [parse_stage(s) for s in spec.split(";") if s.strip()]


def sampler_stages(entries: Iterable[Any] | str) -> list:
    """Stage entries checked and normalized: a name stays a name as written, and is built by its
    sampler's ``from_params``; ``(name, {param: value})``, ``{"name": name, param: value, ...}`` or
    ``"name:param=value,..."`` become ``(name, {param: checked value})``. A string holds ';'-separated stages."""
    if isinstance(entries, str):
        entries = parse_samplers(entries)
    out: list = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = parse_stage(entry)
        if isinstance(entry, Mapping):
            values = dict(entry)
            name = values.pop("name", None)
            if not isinstance(name, str):
                raise ArgumentError(f"samplers[{i}]", entry, 'a name, or an object {"name": ..., param: value}')
            entry = (name, values)
        if isinstance(entry, str):
            stage_name(entry)      # checked; kept as written (build_chain resolves llama.cpp's spellings)
            out.append(entry)
        elif (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)
              and isinstance(entry[1], Mapping)):
            name = stage_name(entry[0])
            out.append((name, check_sampler_params(name, entry[1])))
        else:
            raise ArgumentError(f"samplers[{i}]", entry, "a sampler name or a (name, {params}) pair")
    return out


def with_sampler_params(stages: Iterable[Any], assignments: Iterable[str]) -> list:
    """Stages with ``name.param=value`` assignments (the CLI's ``--sampler-param``) applied to the stage of
    that name; a stage not in the list is an ArgumentError naming the list."""
    stages = list(sampler_stages(stages))
    names = [stage_name(s) if isinstance(s, str) else s[0] for s in stages]
    for text in assignments:
        target, eq, value = text.partition("=")
        stage, dot, param = target.partition(".")
        if not (eq and dot and stage.strip() and param.strip()):
            raise ArgumentError("--sampler-param", text, "name.param=value (e.g. top_k.k=20)")
        name = stage_name(stage)
        if name not in names:
            raise ArgumentError("--sampler-param", text, f"a parameter of a stage in the chain ({';'.join(names)}); "
                                                         f"add {name} to --samplers")
        at = names.index(name)
        old = stages[at]
        values = {} if isinstance(old, str) else dict(old[1])
        values[param.strip()] = value.strip()
        stages[at] = (name, check_sampler_params(name, values))
    return stages


def describe_params(name: str) -> str:
    """``p: float in [0, 1] = 0.5; ...``: the parameters a sampler declares, for ``ggflow plugins``."""
    params, open_ended = declared_params(name)
    parts = [f"{p.name}: {p.accepted()}{'' if p.default is REQUIRED else f' = {p.default!r}'}" for p in params]
    return "; ".join(parts + (["..."] if open_ended else []))


__all__ = ["SamplerParam", "REQUIRED", "STAGE_ALIASES", "check_sampler_params", "declared_params",
           "describe_params", "parse_samplers", "parse_stage", "sampler_stages", "stage_name",
           "with_sampler_params"]
