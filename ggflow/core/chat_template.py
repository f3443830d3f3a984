"""Chat templates: the model's ``tokenizer.chat_template`` (Jinja) rendered as Hugging Face renders it.

The template runs in jinja2's ImmutableSandboxedEnvironment (no attribute access to internals, no
mutation of lists or dicts it is given) with a budget on operations, time and size (a template that
loops forever or doubles a string ends with a ChatTemplateError; see core/template_sandbox.py), with
trim_blocks and lstrip_blocks, and the helpers real
templates call: ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text and
takes indent / separators / sort_keys, the ``{% generation %}`` block, and loop controls. A model
without a template gets llama.cpp's ChatML fallback. See docs/sampling.md ("Chat templates").
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension

from ggflow.core.template_sandbox import BudgetedSandbox, BudgetExceeded, TemplateBudget, render_budgeted
from ggflow.errors import ChatTemplateError

# llama.cpp's fallback (common/chat.cpp) when a model has no template, or names "chatml".
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

_PROBE = "<<ggflow-probe-7d1c>>"


class _TemplateRaised(Exception):
    """raise_exception() called by a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _json_default(value: Any) -> Any:
    # `tools | map(attribute='function')` is a generator in Jinja (a list in llama.cpp's minja)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters and ASCII-escapes text; templates expect plain JSON
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_json_default)


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` (marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller: Callable[[], str]) -> str:
        return caller()


def _environment() -> BudgetedSandbox:
    env = BudgetedSandbox(trim_blocks=True, lstrip_blocks=True,
                          extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"])
    env.add_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def join_text_parts(parts: Sequence[Any]) -> str:
    """Typed content as one string: text parts joined by newlines, others dropped (as llama.cpp does)."""
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and p.get("type") == "text")


class ChatTemplate:
    """A chat template ready to render conversations.

    ``source`` None or "" (or "chatml") uses the ChatML fallback (``is_fallback`` is then True).
    ``bos_token`` / ``eos_token`` are the texts templates see as those variables. ``budget`` bounds
    what one render may do (operations, seconds, characters): a template is code from the model file.
    """

    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "",
                 budget: TemplateBudget = TemplateBudget()):
        if source is not None and not isinstance(source, str):   # e.g. tokenizer.chat_template stored as a u32
            found = f"an array of {len(source)}" if isinstance(source, (list, tuple)) or hasattr(source, "shape") \
                else f"{type(source).__name__} {source!r:.40}"
            raise ChatTemplateError(f"tokenizer.chat_template must be a string, found {found}")
        self.budget = budget
        self.is_fallback = not source or source == "chatml"
        self.source = CHATML_TEMPLATE if self.is_fallback else source
        self.bos_token, self.eos_token = bos_token or "", eos_token or ""
        self._caps: dict[str, bool] = {}
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not parse: {exc.message} (line {exc.lineno})") from None

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, get: Callable[[str], Any], vocab_tokens: Sequence[str] | None = None
                           ) -> "ChatTemplate":
        """From a GGUF file's metadata: ``get(key)`` returns a value or None; ``vocab_tokens`` the token texts.

        Falls back to the ``tool_use`` template, then to ChatML, as llama.cpp does.
        """
        source = get("tokenizer.chat_template")
        if source is None or (isinstance(source, str) and not source):
            source = get("tokenizer.chat_template.tool_use")
        tokens = vocab_tokens if vocab_tokens is not None else get("tokenizer.ggml.tokens")
        tokens = tokens if isinstance(tokens, (list, tuple)) else []

        def token_text(key: str) -> str:
            tid = get(key)
            ok = isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < len(tokens)
            return str(tokens[tid]) if ok else ""

        return cls(source, token_text("tokenizer.ggml.bos_token_id"), token_text("tokenizer.ggml.eos_token_id"))

    @classmethod
    def from_gguf_file(cls, path: str | os.PathLike) -> "ChatTemplate":
        """Read the template and the BOS/EOS token texts from a GGUF file's header."""
        from ggflow.core.gguf_file import GGUFFile

        meta = GGUFFile(path, keep=lambda key: key.startswith("tokenizer."), tensors=False).fields
        return cls.from_gguf_metadata(meta.get)

    @classmethod
    def for_vocab(cls, source: str | None, vocab: Any) -> "ChatTemplate":
        """With BOS/EOS texts from a ``ggflow.core.vocab.Vocab`` (``bos_id``, ``eos_id``, ``token_text``)."""
        def text(tid: int | None) -> str:
            return "" if tid is None else vocab.token_text(tid)

        return cls(source, text(vocab.bos_id), text(vocab.eos_id))

    # -- rendering -----------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> str:
        """The prompt text for a conversation. ``kwargs`` become template variables (e.g. enable_thinking)."""
        messages = self._normalize_content(list(messages))
        return self._render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)

    def _render(self, messages: list, **variables: Any) -> str:
        try:
            return self._render_within_budget(messages, **variables)
        except BudgetExceeded as exc:
            raise ChatTemplateError(f"chat template exceeded its budget: {exc}") from None

    def _render_within_budget(self, messages: list, **variables: Any) -> str:
        """Render; BudgetExceeded passes through, every other failure is a ChatTemplateError."""
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **variables, "messages": messages}
        try:
            return render_budgeted(self._template, self.budget.for_messages(len(messages)), context)
        except BudgetExceeded:
            raise
        except _TemplateRaised as exc:
            raise ChatTemplateError(f"chat template raised: {exc}") from None
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # a template can fail inside any Python operation it calls (e.g. str + list)
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def supports(self, kind: str) -> bool:
        """Whether a one-message conversation with content of ``kind`` ("string" or "typed") renders and
        shows the content. Probed once, lazily."""
        if kind not in self._caps:
            content: Any = _PROBE if kind == "string" else [{"type": "text", "text": _PROBE}]
            try:
                out = self._render_within_budget([{"role": "user", "content": content}],
                                                 add_generation_prompt=False, tools=None)
                self._caps[kind] = _PROBE in out
            except ChatTemplateError:
                self._caps[kind] = False
            except BudgetExceeded as exc:   # one message past the budget: the real render would be too
                raise ChatTemplateError(f"chat template exceeded its budget: {exc}") from None
        return self._caps[kind]

    def _normalize_content(self, messages: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Content given as parts goes to a template that only reads strings as one string (and vice versa)."""
        has_parts = any(isinstance(m.get("content"), list) for m in messages)
        has_strings = any(isinstance(m.get("content"), str) for m in messages)
        if has_parts and not self.supports("typed") and self.supports("string"):
            return [{**m, "content": join_text_parts(m["content"])} if isinstance(m.get("content"), list) else m
                    for m in messages]
        if has_strings and not self.supports("string") and self.supports("typed"):
            return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str)
                    else m for m in messages]
        return messages

    def __repr__(self) -> str:
        return f"ChatTemplate({'ChatML fallback' if self.is_fallback else f'{len(self.source)} chars'})"


__all__ = ["ChatTemplate", "CHATML_TEMPLATE", "join_text_parts"]
