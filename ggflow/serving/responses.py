"""OpenAI-shaped response bodies and stream chunks for a finished (or streaming) completion."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from ggflow.api import Completion

if TYPE_CHECKING:
    from ggflow.structured.chat_tools import ToolCalling
    from ggflow.structured.tool_calls import ToolCall


@dataclass
class ResponseIds:
    """What every chunk of one response repeats: id, object kind, creation time, model name."""
    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"

    def head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def usage(c: Completion) -> dict[str, int]:
    return {"prompt_tokens": len(c.prompt_tokens), "completion_tokens": len(c.tokens),
            "total_tokens": len(c.prompt_tokens) + len(c.tokens)}


def full_response(ids: ResponseIds, c: Completion, tools: "ToolCalling | None" = None) -> dict[str, Any]:
    if ids.chat:
        message, finish = (tools.reply(c.text, c.finish_reason) if tools is not None
                           else ({"role": "assistant", "content": c.text}, c.finish_reason))
        choice = {"index": 0, "message": message, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
    return {**ids.head(False), "choices": [choice], "usage": usage(c), "timings": c.timings.as_dict()}


def chunk(ids: ResponseIds, text: str | None, finish_reason: str | None = None, first: bool = False
          ) -> dict[str, Any]:
    if ids.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return {**ids.head(True), "choices": [choice]}


def tool_calls_chunk(ids: ResponseIds, calls: list["ToolCall"]) -> dict[str, Any]:
    """The reply's tool calls as one delta (each call whole: arguments are not split across chunks)."""
    delta = {"tool_calls": [call.as_openai(index=i) for i, call in enumerate(calls)]}
    return {**ids.head(True), "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def final_chunk(ids: ResponseIds, c: Completion, finish_reason: str | None = None) -> dict[str, Any]:
    """The chunk carrying finish_reason (and llama-server's timings)."""
    return {**chunk(ids, None, finish_reason or c.finish_reason), "timings": c.timings.as_dict()}


def usage_chunk(ids: ResponseIds, c: Completion) -> dict[str, Any]:
    """stream_options.include_usage: one more chunk, with no choices and the usage."""
    return {**ids.head(True), "choices": [], "usage": usage(c)}


def error_body(message: str, kind: str, code: int, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code, **extra}}


def error_response(status: int, message: str, kind: str, **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(message, kind, status, **extra), status_code=status)
