"""Checks of the public arguments, done before any work: each bad value raises an ``ArgumentError`` that names
the argument, the value, and what is accepted. The API, the CLI and the server share these.

Every ``check_*`` returns the value in the one form the caller works with (``stop="END"`` -> ``["END"]``,
``max_tokens=-1`` -> ``None``, logit_bias keys "50256" -> 50256), so a checked value needs no second look.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ggflow.errors import ArgumentError

CHAT_ROLES = ("system", "user", "assistant", "tool")
# OpenAI's content part types that are not text -> what they carry
_NOT_TEXT_PARTS = {"image_url": "image", "image": "image", "input_image": "image", "input_audio": "audio",
                   "audio": "audio", "audio_url": "audio", "file": "file", "input_file": "file", "video_url": "video"}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in [lo, hi] (either bound may be open)."""
    if not _is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ArgumentError(name, value, f"an integer{_bounds(lo, hi)}")
    return int(value)


def check_number(name: str, value: Any, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> float:
    """A finite real number in [lo, hi] ((lo, hi] with lo_open)."""
    ok = _is_number(value) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise ArgumentError(name, value, f"a finite number{_bounds(lo, hi, lo_open)}")
    return float(value)


def _bounds(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    if lo is None:
        return f" <= {hi:g}"
    return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(name, value, "True or False")
    return bool(value)


# -- generation arguments ------------------------------------------------------------------------------
def check_max_tokens(value: Any) -> int | None:
    """None, -1 or 0: no limit (until the end of text or a full context, as llama.cpp's n_predict -1);
    below -1 is refused (-2 or -2**63 is a mistake, not a wish for no limit)."""
    if value is None:
        return None
    value = check_range("max_tokens", value)
    return value if value > 0 else None


def check_stop(value: Any) -> list[str]:
    """A string or a list of strings (None: none). A string is one stop string, not its characters."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise ArgumentError("stop", value, "a string or a list of strings")


def check_seed(value: Any, name: str = "seed") -> int | None:
    """None (or -1): a random seed; any other integer is used mod 2**32, as llama.cpp does."""
    if value is None:
        return None
    return check_int(name, value)


def check_logprobs(value: Any, n_vocab: int, name: str = "logprobs") -> int | None:
    """None: no log-probabilities; N >= 0: each token's, and the N most likely alternatives."""
    if value is None:
        return None
    return check_int(name, value, 0, n_vocab)


def check_token_ids(value: Any, n_vocab: int, name: str = "prompt") -> list[int]:
    """A flat sequence of integer token ids in [0, n_vocab)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ArgumentError(name, f"<array {value.dtype} {value.shape}>", "a 1-D sequence of integer token ids")
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ArgumentError(name, value, "a list of integer token ids")
    for i, tok in enumerate(value):
        if not _is_int(tok):
            raise ArgumentError(f"{name}[{i}]", tok, f"an integer token id in [0, {n_vocab})")
        if not 0 <= tok < n_vocab:
            raise ArgumentError(f"{name}[{i}]", tok, f"a token id in [0, {n_vocab}) ({tok} is outside the vocabulary)")
    return [int(t) for t in value]


def check_prompt(value: Any, n_vocab: int) -> "str | list[int]":
    """Text, or token ids."""
    if isinstance(value, str):
        return check_no_surrogates("prompt", value)
    if value is None or isinstance(value, (bytes, dict, numbers.Number)):
        raise ArgumentError("prompt", value, "a string or a list of integer token ids")
    return check_token_ids(value, n_vocab)


def check_text(value: Any, name: str = "text") -> str:
    """A string, or UTF-8 bytes (llama-cpp-python's tokenize takes bytes)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArgumentError(name, value, f"a string or valid UTF-8 bytes ({exc.reason} at byte {exc.start})")
    if not isinstance(value, str):
        raise ArgumentError(name, value, "a string or UTF-8 bytes")
    return check_no_surrogates(name, value)


def check_no_surrogates(name: str, value: str) -> str:
    """A str with no lone UTF-16 surrogate ("\\ud800"): such a str is not text (no UTF-8 can spell it), as the
    server refuses a body that escapes one; the vocabulary alone would read it as U+FFFD."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ArgumentError(name, value, f"text (a lone UTF-16 surrogate {value[exc.start]!r} at index "
                                         f"{exc.start} is not a character)") from None
    return value


# -- chat ----------------------------------------------------------------------------------------------
def check_messages(value: Any) -> list[dict[str, Any]]:
    """A non-empty list of {"role": system|user|assistant|tool, "content": text or a list of text parts}."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ArgumentError("messages", value, 'a non-empty list of {"role": ..., "content": ...} dicts')
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ArgumentError(where, message, 'a dict {"role": ..., "content": ...}')
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ArgumentError(f"{where}['role']", role, f"one of {', '.join(CHAT_ROLES)}")
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            pass  # an assistant turn that only calls tools
        elif isinstance(content, (list, tuple)):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind in _NOT_TEXT_PARTS:   # said, not dropped: the reply would ignore what the user sent
                    raise ArgumentError(f"{where}['content'][{j}]", {"type": kind},
                                        f'{{"type": "text", "text": a string}}: {_NOT_TEXT_PARTS[kind]} content '
                                        "parts are not supported (ggflow's models read text only)")
                if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ArgumentError(f"{where}['content'][{j}]", part, '{"type": "text", "text": a string}')
        elif not isinstance(content, str):
            raise ArgumentError(f"{where}['content']", content, "a string or a list of text parts")
        out.append(dict(message))
    return out


def check_tools(value: Any) -> list[dict[str, Any]] | None:
    """OpenAI tools: a list of {"type": "function", "function": {"name": ..., ...}} (None: no tools)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise ArgumentError("tools", value, 'a list of {"type": "function", "function": {...}} dicts')
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not (isinstance(fn, Mapping) and isinstance(fn.get("name"), str)):
            raise ArgumentError(f"tools[{i}]", tool, '{"type": "function", "function": {"name": a string, ...}}')
    return [dict(t) for t in value]


def check_functions(value: Any) -> list[dict[str, Any]]:
    """OpenAI's older functions: a list of {"name": ..., "parameters": {...}}."""
    if not isinstance(value, (list, tuple)):
        raise ArgumentError("functions", value, 'a list of {"name": ..., "parameters": {...}} dicts')
    for i, fn in enumerate(value):
        if not (isinstance(fn, Mapping) and isinstance(fn.get("name"), str)):
            raise ArgumentError(f"functions[{i}]", fn, '{"name": a string, "parameters": {...}}')
    return [dict(f) for f in value]


def check_tool_choice(value: Any) -> Any:
    """None, "none", "auto", "required", or {"type": "function", "function": {"name": ...}}."""
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("function"), Mapping):
        return dict(value)
    raise ArgumentError("tool_choice", value, '"none", "auto", "required" or {"type": "function", '
                                              '"function": {"name": ...}}')


# -- sampling ------------------------------------------------------------------------------------------
def check_logit_bias(value: Any, n_vocab: int) -> dict[int, float]:
    """{token id: bias}: ids as integers (or their decimal strings, as JSON gives them), biases finite or -inf."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ArgumentError("logit_bias", value, "a dict {token id: bias}")
    out = {}
    for key, bias in value.items():
        # ASCII decimal digits only: str.isdigit() and int() also take "٥" (Arabic-Indic five), "+5", " 5"
        tok = int(key) if isinstance(key, str) and _DECIMAL.fullmatch(key) else key
        if not _is_int(tok) or not 0 <= tok < n_vocab:
            raise ArgumentError("logit_bias", {key: bias}, f"a dict whose keys are token ids in [0, {n_vocab}) "
                                                           f"({key!r} is not one)")
        if not _is_number(bias) or (math.isnan(bias) or bias == math.inf):
            raise ArgumentError(f"logit_bias[{key!r}]", bias, "a finite number (or -inf to ban the token)")
        out[int(tok)] = float(bias)
    return out


_DECIMAL = re.compile(r"-?[0-9]+")


def check_sequence_breakers(value: Any) -> list:
    """DRY's sequence breakers: strings, or lists of token ids."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ArgumentError("dry_sequence_breakers", value, "a list of strings (or of token id lists)")
    for i, b in enumerate(value):
        if not (isinstance(b, str) or (isinstance(b, (list, tuple)) and b and all(_is_int(t) for t in b))):
            raise ArgumentError(f"dry_sequence_breakers[{i}]", b, "a string or a non-empty list of token ids")
    return list(value)


@dataclass(frozen=True)
class Range:
    """What one field accepts: an integer or a finite number in [lo, hi] ((lo, hi] with lo_open)."""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    integer: bool = False

    def check(self, name: str, value: Any) -> Any:
        if self.integer:
            return check_int(name, value, self.lo, self.hi)   # type: ignore[arg-type]
        return check_number(name, value, self.lo, self.hi, self.lo_open)


# The one table of ranges: LLM's arguments, the server's request fields and the CLI's flags are checked
# against it (serving/openai_params.py, cli/common.py), so a value one door refuses every door refuses.
RANGES: dict[str, Range] = {
    "temperature": Range(0.0), "top_p": Range(0.0, 1.0, lo_open=True), "min_p": Range(0.0, 1.0),
    "typical_p": Range(0.0, 1.0, lo_open=True), "dynatemp_range": Range(0.0), "dynatemp_exponent": Range(),
    "repeat_penalty": Range(0.0, lo_open=True), "frequency_penalty": Range(), "presence_penalty": Range(),
    "dry_multiplier": Range(0.0), "dry_base": Range(), "xtc_probability": Range(0.0, 1.0),
    "xtc_threshold": Range(), "top_n_sigma": Range(), "mirostat_tau": Range(0.0), "mirostat_eta": Range(0.0),
    "top_k": Range(0, integer=True), "min_keep": Range(0, integer=True), "repeat_last_n": Range(-1, integer=True),
    "dry_allowed_length": Range(0, integer=True), "dry_penalty_last_n": Range(-1, integer=True),
    "mirostat": Range(0, 2, integer=True),
    # -1: no limit (llama.cpp's n_predict -1); LLM also takes 0 as no limit (llama-cpp-python), the server
    # refuses 0 (OpenAI); below -1 nobody takes
    "max_tokens": Range(-1, integer=True),
}
SAMPLING_RANGES = tuple(name for name in RANGES if name != "max_tokens")


def check_range(name: str, value: Any) -> Any:
    """``value`` checked against the table's range for ``name``."""
    return RANGES[name].check(name, value)


def cli_type(name: str, kind: type) -> Any:
    """An argparse type for a flag setting field ``name``: parsed as ``kind``, then checked against the table."""
    import argparse

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        try:
            return check_range(name, value)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(f"{value} is out of range: {name} must be {exc.accepted}") from None

    parse.__name__ = kind.__name__
    return parse


def _checked_fields(get: Any, n_vocab: int) -> dict[str, Any]:
    """Check the sampling fields ``get(name, default)`` returns; the normalized ones, by name."""
    for name in SAMPLING_RANGES:
        RANGES[name].check(name, get(name, 0))
    samplers = get("samplers", None)
    if samplers is not None:
        if isinstance(samplers, str) or not isinstance(samplers, (list, tuple)):
            raise ArgumentError("samplers", samplers, "a list of sampler names (or (name, {params}) pairs)")
        for i, s in enumerate(samplers):
            if not (isinstance(s, str) or (isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str)
                                           and isinstance(s[1], Mapping))):
                raise ArgumentError(f"samplers[{i}]", s, "a sampler name or a (name, {params}) pair")
    return {"seed": check_seed(get("seed", None)),
            "logit_bias": check_logit_bias(get("logit_bias", None), n_vocab),
            "dry_sequence_breakers": check_sequence_breakers(get("dry_sequence_breakers", ()))}


def check_sampling(params: Any, n_vocab: int) -> Any:
    """Check a SamplingParams record field by field; return it with logit_bias and the seed normalized."""
    import dataclasses

    changes = _checked_fields(lambda name, default: getattr(params, name, default), n_vocab)
    return dataclasses.replace(params, **changes)


def sampling_params(options: Mapping[str, Any], n_vocab: int, record: Any = None) -> Any:
    """A checked SamplingParams from a record or from its fields as keywords (not both)."""
    import dataclasses

    from ggflow.core.sampling import SamplingParams

    if record is not None:
        if options:
            raise ArgumentError("sampling", record, "given alone: pass options either as a SamplingParams or as "
                                                    f"keywords, not both (got keywords {sorted(options)})")
        if not isinstance(record, SamplingParams):
            raise ArgumentError("sampling", record, "a ggflow.SamplingParams")
        return check_sampling(record, n_vocab)
    fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ArgumentError(unknown[0], options[unknown[0]], f"a known sampling option (unknown sampling option "
                                                            f"{unknown[0]!r}; known: {', '.join(sorted(fields))})")
    defaults = SamplingParams()
    # checked before the record is built, so SamplingParams' own checks never meet a value of the wrong type
    changes = _checked_fields(lambda name, default: options.get(name, getattr(defaults, name, default)), n_vocab)
    return SamplingParams(**{**options, **changes})


# -- context size --------------------------------------------------------------------------------------
def check_n_ctx(value: Any) -> int | None:
    """None or 0: the model's default; otherwise a positive integer."""
    if value is None:
        return None
    value = check_int("n_ctx", value, 0)
    return value or None
