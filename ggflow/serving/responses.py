"""OpenAI-shaped response bodies and stream chunks for a finished (or streaming) completion."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from ggflow.generation.logprobs import chat_logprobs, completion_logprobs, echoed_entries, generated_entries
from ggflow.generation.records import Completion
from ggflow.generation.request import Piece

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


@dataclass
class ChoiceShape:
    """What a choice carries besides its text: OpenAI's ``logprobs`` (chat: {"content": [...]}; completions:
    llama-cpp-python's tokens / token_logprobs / top_logprobs / text_offset) and ``echo``'s prompt text."""
    vocab: Any
    logprobs: bool = False
    echo: str | None = None                 # completions: the prompt text the answer repeats

    def choice_logprobs(self, c: Completion, chat: bool) -> Any:
        if not self.logprobs:
            return None
        if chat:
            return chat_logprobs(self.vocab, generated_entries(self.vocab, c))
        if self.echo is not None:
            return completion_logprobs(self.vocab, echoed_entries(self.vocab, c), 0)
        return completion_logprobs(self.vocab, generated_entries(self.vocab, c), 0)

    def piece_logprobs(self, piece: Piece, chat: bool) -> Any:
        """A streamed token's entry (None without logprobs, or for text released at the end)."""
        if not self.logprobs or piece.logprob is None:
            return None
        if chat:
            return chat_logprobs(self.vocab, [piece.logprob])
        return completion_logprobs(self.vocab, [piece.logprob], 0)


def usage(c: Completion, completions: "list[Completion] | None" = None) -> dict[str, Any]:
    """Every choice's tokens count (n > 1); the prompt's once."""
    n_out = sum(len(x.tokens) for x in completions) if completions else len(c.tokens)
    return {"prompt_tokens": len(c.prompt_tokens), "completion_tokens": n_out,
            "total_tokens": len(c.prompt_tokens) + n_out,
            "prompt_tokens_details": {"cached_tokens": c.timings.cached_n}}


def full_response(ids: ResponseIds, completions: "list[Completion]", tools: "ToolCalling | None" = None,
                  shape: ChoiceShape | None = None) -> dict[str, Any]:
    choices = []
    for index, c in enumerate(completions):
        lp = shape.choice_logprobs(c, ids.chat) if shape is not None else None
        if ids.chat:
            message, finish = (tools.reply(c.text, c.finish_reason) if tools is not None
                               else ({"role": "assistant", "content": c.text}, c.finish_reason))
            choices.append({"index": index, "message": message, "logprobs": lp, "finish_reason": finish})
        else:
            text = shape.echo + c.text if shape is not None and shape.echo is not None else c.text
            choices.append({"index": index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason})
    first = completions[0]
    return {**ids.head(False), "choices": choices, "usage": usage(first, completions),
            "timings": first.timings.as_dict()}


def chunk(ids: ResponseIds, text: str | None, finish_reason: str | None = None, first: bool = False,
          logprobs: Any = None) -> dict[str, Any]:
    if ids.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
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
