"""ToolCalling: a chat request's tools resolved against the model's chat template, from the prompt to the reply.

One object per request, shared by ``LLM.create_chat_completion`` and the server's chat route: it says
what the template sees (``messages``, and the tools for ``render``), what constrains the reply
(``grammar``), and what the reply becomes (an OpenAI assistant message with ``tool_calls`` and
``finish_reason: "tool_calls"``), whole or streamed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ggflow.structured.grammar import Grammar
from ggflow.structured.tool_calls import ToolCallFormat, ToolCallStream, ToolSpec, detect_format

FINISH_TOOL_CALLS = "tool_calls"


@dataclass
class ToolCalling:
    spec: ToolSpec
    fmt: ToolCallFormat
    tools: list[dict[str, Any]]

    @classmethod
    def for_request(cls, tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = True,
                    template_source: str | None = None) -> "ToolCalling | None":
        """None when the request has no tools (a tool_choice without tools is an error)."""
        spec = ToolSpec.parse(tools, tool_choice, parallel_tool_calls)
        if spec is None:
            return None
        return cls(spec, detect_format(template_source), list(tools))

    @property
    def active(self) -> bool:
        """tool_choice "none": the tools are shown to the template, but the reply is plain text."""
        return self.spec.choice != "none"

    def messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.fmt.prepare(list(messages), self.spec, self.active)

    def grammar(self) -> Grammar | None:
        return self.fmt.grammar(self.spec) if self.active else None

    def reply(self, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
        """The assistant message for a finished reply, and its finish reason."""
        if not self.active:
            return {"role": "assistant", "content": text}, finish_reason
        content, calls = self.fmt.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if not calls:
            return message, finish_reason
        message["tool_calls"] = [c.as_openai() for c in calls]
        return message, FINISH_TOOL_CALLS if finish_reason == "stop" else finish_reason

    def stream(self) -> "ToolCallStream | None":
        return ToolCallStream(self.fmt) if self.active else None
