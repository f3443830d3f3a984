"""Tool calls: the model family's syntax, recognised from its chat template as llama.cpp's common/chat.cpp does.

Three formats cover the common families:

- ``hermes`` (Hermes 2 Pro, Qwen 2.5, and templates written after them): the template shows the tools and
  the model writes ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, after optional text;
- ``llama3_json`` (Llama 3.1 / 3.2 / 3.3): the model's whole reply is ``{"name": ..., "parameters": {...}}``;
- ``generic`` (any other template): the tools are described in a system message and the reply is JSON,
  ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or ``{"response": "..."}`` (llama.cpp's generic format).

``tool_choice`` "required" or a named function constrains the reply to a call (of that function) through a
grammar whose arguments follow each tool's JSON schema; "auto" lets the model choose (the generic format is
still JSON, so it stays constrained to one of its two shapes); "none" neither constrains nor parses.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ggflow.errors import GrammarError
from ggflow.structured.grammar import Grammar

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools and tool_choice, checked: the function schemas by name, and what is required."""
    functions: dict[str, dict[str, Any]]   # name -> JSON schema of its arguments
    choice: str                            # none | auto | required
    forced: str | None = None              # a named function the reply must call
    parallel: bool = True

    @classmethod
    def parse(cls, tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = True) -> "ToolSpec | None":
        if tools is None:
            if tool_choice not in (None, "none", "auto"):
                raise GrammarError(f"tool_choice {tool_choice!r} needs tools")
            return None
        if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not tools:
            raise GrammarError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
        functions: dict[str, dict[str, Any]] = {}
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, Mapping) and tool.get("type", "function") == "function" \
                else None
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str) or not name:
                raise GrammarError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                   f"\"parameters\": {{...}}}}}}, got {tool!r:.120}")
            params = fn.get("parameters", {"type": "object"})
            if not isinstance(params, Mapping):
                raise GrammarError(f"tools[{i}].function.parameters must be a JSON schema object")
            functions[name] = dict(params)
        forced = None
        if tool_choice is None:
            choice = "auto"
        elif tool_choice in ("none", "auto", "required"):
            choice = tool_choice
        elif isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
            forced, choice = tool_choice["function"].get("name"), "required"
            if forced not in functions:
                raise GrammarError(f"tool_choice names function {forced!r}, which is not among the tools "
                                   f"({', '.join(functions)})")
        else:
            raise GrammarError(f"tool_choice must be none, auto, required or {{\"type\": \"function\", "
                               f"\"function\": {{\"name\": ...}}}}, got {tool_choice!r:.80}")
        return cls(functions, choice, forced, bool(parallel_tool_calls))

    def callable(self) -> dict[str, dict[str, Any]]:
        return {self.forced: self.functions[self.forced]} if self.forced else self.functions


def _call_schema(name: str, params: Mapping[str, Any], args_key: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": name}, args_key: dict(params)},
            "required": ["name", args_key], "additionalProperties": False}


def _any_call_schema(spec: ToolSpec, args_key: str) -> dict[str, Any]:
    calls = [_call_schema(n, p, args_key) for n, p in spec.callable().items()]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


class ToolCallFormat:
    name = "base"

    def prepare(self, messages: list[dict[str, Any]], spec: ToolSpec, active: bool = True) -> list[dict[str, Any]]:
        """The conversation as the template should see it (the tools themselves go in ``tools=``);
        ``active`` is False for tool_choice "none" (the reply will be text)."""
        return messages

    def grammar(self, spec: ToolSpec) -> Grammar | None:
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, tool calls) of a reply."""
        raise NotImplementedError

    def holds_back(self, text: str) -> int:
        """How much of the text so far (from its end) may still turn out to be a tool call, and must not be
        streamed as content yet."""
        return len(text)


class HermesFormat(ToolCallFormat):
    name = "hermes"
    _open, _close = "<tool_call>", "</tool_call>"
    _pattern = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def grammar(self, spec: ToolSpec) -> Grammar | None:
        if spec.choice != "required":
            return None
        schema = json.dumps({**_any_call_schema(spec, "arguments"), "x-guidance": _JSON_STYLE})
        repeat = "+" if spec.parallel else ""
        lark = (f"start: call{repeat}\n"
                f"call: \"{self._open}\\n\" body \"\\n{self._close}\"\n"
                f"body: %json {schema}\n")
        return Grammar.from_lark(lark)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        calls = []
        for body in self._pattern.findall(text):
            obj = _loads(body)
            if isinstance(obj, Mapping) and isinstance(obj.get("name"), str):
                args = obj.get("arguments", {})
                calls.append(ToolCall(obj["name"], args if isinstance(args, dict) else {"value": args}))
        content = self._pattern.sub("", text).strip() if calls else text
        return (content or None), calls

    def holds_back(self, text: str) -> int:
        start = text.find(self._open)
        if start >= 0:
            return len(text) - start
        # a tail that could still grow into "<tool_call>"
        return max((k for k in range(1, len(self._open)) if text.endswith(self._open[:k])), default=0)


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"

    def grammar(self, spec: ToolSpec) -> Grammar | None:
        if spec.choice != "required":
            return None
        return Grammar.from_json_schema(_any_call_schema(spec, "parameters"))

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        obj = _loads(body) if body.startswith("{") else None
        if isinstance(obj, Mapping) and isinstance(obj.get("name"), str):
            args = obj.get("parameters", obj.get("arguments", {}))
            return None, [ToolCall(obj["name"], args if isinstance(args, dict) else {"value": args})]
        return (text or None), []

    def holds_back(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) if not stripped or stripped[0] in "{<" else 0


class GenericFormat(ToolCallFormat):
    name = "generic"

    def prepare(self, messages: list[dict[str, Any]], spec: ToolSpec, active: bool = True) -> list[dict[str, Any]]:
        # a template that knows nothing of tools sees earlier calls as the JSON the model wrote
        messages = [_calls_as_content(m) for m in messages]
        if not active:
            return messages
        tools = [{"name": n, "parameters": p} for n, p in spec.callable().items()]
        note = ("You can call any of the following tools to satisfy the user's requests: "
                + json.dumps(tools, ensure_ascii=False)
                + '\n\nRespond in JSON: {"tool_calls": [{"name": ..., "arguments": {...}}]} to call tools'
                + ('' if spec.choice == "required" else ', or {"response": "..."} to answer directly') + ".")
        if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
            return [{**messages[0], "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
        return [{"role": "system", "content": note}, *messages]

    def grammar(self, spec: ToolSpec) -> Grammar | None:
        calls = {"type": "object", "properties": {
            "tool_calls": {"type": "array", "items": _any_call_schema(spec, "arguments"), "minItems": 1,
                           **({} if spec.parallel else {"maxItems": 1})}},
            "required": ["tool_calls"], "additionalProperties": False}
        if spec.choice == "required":
            return Grammar.from_json_schema(calls)
        answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                  "additionalProperties": False}
        return Grammar.from_json_schema({"anyOf": [calls, answer]})

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        obj = _loads(text.strip())
        if isinstance(obj, Mapping) and isinstance(obj.get("tool_calls"), list):
            calls = [ToolCall(c["name"], c.get("arguments") if isinstance(c.get("arguments"), dict) else {})
                     for c in obj["tool_calls"] if isinstance(c, Mapping) and isinstance(c.get("name"), str)]
            return None, calls
        if isinstance(obj, Mapping) and isinstance(obj.get("response"), str):
            return obj["response"], []
        return (text or None), []


def _calls_as_content(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's tool_calls written into its content, as the generic format's reply JSON."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not calls:
        return message
    written = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else {}
        args = fn.get("arguments", {})
        written.append({"name": fn.get("name"), "arguments": _loads(args) if isinstance(args, str) else args})
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": json.dumps({"tool_calls": written}, ensure_ascii=False)}


def detect_format(template_source: str | None) -> ToolCallFormat:
    """The tool-call format a chat template was written for (llama.cpp's common/chat.cpp detection)."""
    src = template_source or ""
    if "<tool_call>" in src and "<function=" not in src and "<arg_key>" not in src:
        return HermesFormat()
    if "<|start_header_id|>" in src and ("ipython" in src or "<|python_tag|>" in src):
        return Llama3JsonFormat()
    return GenericFormat()


class ToolCallStream:
    """Streams a reply's content as it comes while holding back what may be a tool call; ``finish``
    gives the content still held and the calls."""

    def __init__(self, fmt: ToolCallFormat):
        self.fmt, self.text, self._sent = fmt, "", 0

    def feed(self, piece: str) -> str:
        self.text += piece
        safe = len(self.text) - self.fmt.holds_back(self.text)
        if safe <= self._sent:
            return ""
        out, self._sent = self.text[self._sent:safe], safe
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = self.fmt.parse(self.text)
        if not calls:
            return (self.text[self._sent:] if content == self.text else content or ""), []
        unsent, _ = self.fmt.parse(self.text[self._sent:])   # what was held back, less the calls
        return unsent or "", calls
