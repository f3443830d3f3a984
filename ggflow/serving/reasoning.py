"""Reasoning ("thinking") text: ``<think>...</think>`` moved out of a reply's content into
``reasoning_content``, as llama-server's ``reasoning_format`` does.

- ``none``: the text is left as it is;
- ``deepseek`` / ``auto``: what is inside <think>...</think> (or, when the prompt opened the block, what comes
  before </think>) is reasoning; the rest is content. ``deepseek-legacy`` is taken as ``deepseek``.

``ReasoningSplitter`` does the same on a stream: each piece of text comes out as (reasoning, content) deltas,
holding back only what may be the start of a tag. ``reasoning_budget`` 0 disables thinking: the template is
rendered with enable_thinking false, and a reply that still thinks has its reasoning dropped.
"""
from __future__ import annotations

from typing import Any

from ggflow.errors import GGFlowError

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def check_format(name: str | None, default: str = "auto") -> str:
    name = default if name is None else name
    if name not in FORMATS:
        raise GGFlowError(f"reasoning_format must be one of {', '.join(FORMATS)}; got {name!r}")
    return name


def prompt_opens_thinking(prompt_text: str) -> bool:
    """The rendered prompt ends inside a think block (templates that open <think> for the model)."""
    tail = prompt_text.rstrip()
    return tail.rfind(OPEN) > tail.rfind(CLOSE)


class ReasoningSplitter:
    """Splits a stream of text into reasoning and content deltas."""

    def __init__(self, enabled: bool = True, in_think: bool = False, keep_reasoning: bool = True):
        self.enabled, self.in_think, self.keep = enabled, in_think, keep_reasoning
        self.started = in_think      # a think block may open only at the reply's start (leading space aside)
        self._held = ""
        self._seen_text = False
        self._eat_newlines = False   # after a tag: the newlines that follow it are part of neither side

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) released by ``text``."""
        if not self.enabled:
            return "", text
        self._held += text
        reasoning, content = [], []
        while self._held:
            if self._eat_newlines:
                self._held = self._held.lstrip("\n")
                if not self._held:
                    break
                self._eat_newlines = False
            if self.in_think:
                i = self._held.find(CLOSE)
                if i >= 0:
                    reasoning.append(self._held[:i])
                    self._held = self._held[i + len(CLOSE):]
                    self.in_think, self._eat_newlines = False, True
                    continue
                keep = _partial_suffix(self._held, CLOSE)
                reasoning.append(self._held[:len(self._held) - keep])
                self._held = self._held[len(self._held) - keep:]
                break
            if not self.started and not self._seen_text:
                stripped = self._held.lstrip()
                if stripped.startswith(OPEN):
                    self._held = stripped[len(OPEN):]
                    self.in_think = self.started = self._eat_newlines = True
                    continue
                if OPEN.startswith(stripped):   # may still become <think>
                    break
            self._seen_text = True
            content.append(self._held)
            self._held = ""
        r = "".join(reasoning)
        return (r if self.keep else ""), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back at the end (an unclosed think block is reasoning)."""
        held, self._held = self._held, ""
        if self.in_think:
            return (held if self.keep else ""), ""
        return "", held


def split_reasoning(text: str, fmt: str, in_think: bool = False, keep_reasoning: bool = True) -> tuple[str, str]:
    """A whole reply's (reasoning, content) for ``reasoning_format`` ``fmt``."""
    s = ReasoningSplitter(fmt != "none", in_think, keep_reasoning)
    r1, c1 = s.feed(text)
    r2, c2 = s.finish()
    return r1 + r2, c1 + c2


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningOptions:
    """A chat request's reasoning handling: its format (or the server's), its budget, and whether the
    rendered prompt opened a think block."""

    def __init__(self, fmt: str, budget: int | None, in_think: bool = False, thinking: str = "auto"):
        self.format, self.thinking = fmt, thinking   # thinking: the server's --reasoning on / off / auto
        if budget is None and thinking == "off":
            budget = 0
        if budget is not None and budget not in (-1, 0):
            raise GGFlowError(f"reasoning_budget must be -1 (unlimited) or 0 (no thinking); got {budget}: "
                              f"a token budget for thinking is not supported")
        self.keep = budget != 0
        self.in_think = in_think

    @classmethod
    def for_request(cls, body: Any, server_default: str, thinking: str = "auto") -> "ReasoningOptions":
        return cls(check_format(getattr(body, "reasoning_format", None), server_default),
                   getattr(body, "reasoning_budget", None), thinking=thinking)

    def template_kwargs(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """chat_template_kwargs, with enable_thinking false when thinking is disabled."""
        kwargs = dict(given or {})
        reserved = {"messages", "tools", "add_generation_prompt"} & set(kwargs)
        if reserved:
            raise GGFlowError(f"chat_template_kwargs cannot set {', '.join(sorted(reserved))}")
        if not self.keep:
            kwargs.setdefault("enable_thinking", False)
        elif self.thinking == "on":
            kwargs.setdefault("enable_thinking", True)
        return kwargs

    @property
    def active(self) -> bool:
        return self.format != "none" or not self.keep

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.format != "none", self.in_think, self.keep)

    def split(self, text: str) -> tuple[str, str]:
        return split_reasoning(text, self.format, self.in_think, self.keep)


def reasoning_chunk(ids: Any, thought: str, first: bool = False) -> dict[str, Any]:
    """A streamed chat chunk whose delta is reasoning_content."""
    from ggflow.serving.responses import chunk
    out = chunk(ids, None, first=first)
    out["choices"][0]["delta"]["reasoning_content"] = thought
    return out
