"""Anthropic's Messages API on ggflow serve: POST /v1/messages (plain and streamed, tool use) and
/v1/messages/count_tokens. The conversation is turned into OpenAI-shaped messages and rendered with the
model's chat template, as llama-server does; refusals have Anthropic's error shape
({"type": "error", "error": {"type", "message"}})."""
from __future__ import annotations

import json
import uuid
from typing import Any, Callable, Union

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from ggflow.errors import GGFlowError
from ggflow.generation.records import Completion
from ggflow.generation.request import Piece
from ggflow.serving.chat_prep import PreparedChat, prepare_chat
from ggflow.serving.native_run import ClientGone, GenerationFailed, complete, make_request, pieces, stop_type
from ggflow.serving.openai_params import GenerationBody, _Strict
from ggflow.serving.reasoning import ReasoningSplitter, split_reasoning

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                         500: "api_error", 503: "overloaded_error"}


class ThinkingConfig(_Strict):
    type: str = "disabled"
    budget_tokens: int | None = None


class MessagesBody(GenerationBody):
    messages: list[dict[str, Any]]
    system: Union[str, list[dict[str, Any]], None] = None
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])


class CountTokensBody(_Strict):
    model: str | None = None
    messages: list[dict[str, Any]]
    system: Union[str, list[dict[str, Any]], None] = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None


def _text_of(blocks: Any, where: str) -> str:
    """A string, or text blocks joined (images refused: ggflow has no vision models)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise GGFlowError(f"{where} must be a string or a list of content blocks")
    parts = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise GGFlowError(f"{where}[{i}] must be a content block with a type")
        if b["type"] == "text":
            if not isinstance(b.get("text"), str):
                raise GGFlowError(f"{where}[{i}].text must be a string")
            parts.append(b["text"])
        elif b["type"] == "image":
            raise GGFlowError(f"{where}[{i}]: image input is not supported: this server has no vision model")
        else:
            raise GGFlowError(f"{where}[{i}]: a block of type {b['type']!r} cannot be here")
    return "\n".join(parts)


def openai_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic's system and messages as OpenAI chat messages (tool_use -> tool_calls, tool_result -> tool)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for n, m in enumerate(messages):
        where = f"messages[{n}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise GGFlowError(f"{where}.role must be user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise GGFlowError(f"{where}.content must be a string or a list of content blocks")
        texts, calls, thinking = [], [], []
        for i, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            at = f"{where}.content[{i}]"
            if kind == "text" or kind == "image":
                texts.append(_text_of([b], f"{where}.content"))
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise GGFlowError(f"{at}: tool_use needs a string name and an object input")
                calls.append({"id": str(b.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"), "type": "function",
                              "function": {"name": b["name"],
                                           "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}})
            elif kind == "tool_result" and m["role"] == "user":
                result = b.get("content", "")
                text = _text_of(result, f"{at}.content") if result is not None else ""
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                            "content": ("Error: " + text) if b.get("is_error") else text})
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                if isinstance(b.get("thinking"), str):
                    thinking.append(b["thinking"])
            else:
                raise GGFlowError(f"{at}: a block of type {kind!r} cannot be in a {m['role']} message")
        if texts or calls or thinking or not content:
            msg: dict[str, Any] = {"role": m["role"], "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "\n".join(thinking)
            out.append(msg)
    return out


def openai_tools(tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None) -> tuple[Any, Any]:
    if tools is None:
        if choice is not None and choice.get("type") not in ("auto", "none"):
            raise GGFlowError("tool_choice needs tools")
        return None, None
    converted = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise GGFlowError(f"tools[{i}] needs a string name")
        schema = t.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise GGFlowError(f"tools[{i}].input_schema must be a JSON schema object")
        converted.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                            "parameters": schema}})
    kind = (choice or {}).get("type", "auto")
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise GGFlowError("tool_choice of type tool needs a name")
        mapped = {"type": "function", "function": {"name": choice["name"]}}
    if mapped is None:
        raise GGFlowError(f"tool_choice.type must be auto, any, tool or none; got {kind!r}")
    return converted, mapped


def _template_kwargs(body: Any) -> dict[str, Any]:
    kwargs = dict(getattr(body, "chat_template_kwargs", None) or {})
    if body.thinking is not None:
        kwargs.setdefault("enable_thinking", body.thinking.type == "enabled")
    return kwargs


def _prepare(state: Any, engine: Any, body: Any) -> PreparedChat:
    tools, choice = openai_tools(body.tools, body.tool_choice)
    return prepare_chat(state, engine, openai_messages(body.system, body.messages), tools, choice,
                        _template_kwargs(body), grammar=getattr(body, "constraint", lambda: None)())


def _stop_reason(vocab: Any, c: Completion, stops: list[str], tool_calls: bool) -> tuple[str, str | None]:
    if tool_calls:
        return "tool_use", None
    kind, word = stop_type(vocab, c, stops)
    return {"limit": "max_tokens", "word": "stop_sequence"}.get(kind, "end_turn"), (word if kind == "word" else None)


def _usage(c: Completion) -> dict[str, int]:
    return {"cache_read_input_tokens": c.timings.cached_n, "cache_creation_input_tokens": 0,
            "input_tokens": len(c.prompt_tokens) - c.timings.cached_n, "output_tokens": len(c.tokens)}


def _tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {"type": "tool_use", "id": call["id"].replace("call_", "toolu_", 1), "name": fn["name"],
            "input": json.loads(fn["arguments"])}


def anthropic_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"),
                                                     "message": message}}, status_code=status)


def _status_of(exc: GGFlowError) -> int:
    from ggflow.serving.app import _ERRORS
    return next(s for t, s, _ in _ERRORS if isinstance(exc, t))


def add_anthropic_routes(app: Any, state: Any, parse: Callable) -> None:
    @app.post("/v1/messages")
    async def messages(http: HTTPRequest):
        try:
            body = await parse(http, MessagesBody)
            engine = state.ready()
            prep = _prepare(state, engine, body)
            thinking = body.thinking is not None and body.thinking.type == "enabled"
            pair = make_request(engine, prep.tokens, body, engine.n_ctx, body.stream, grammar=prep.grammar)
            if body.stream:
                from ggflow.serving.rerank import check_can_generate
                check_can_generate(http, engine)
                engine.submit(pair[0])
                return StreamingResponse(_stream(pair, prep, body, state.model_name, engine.vocab, thinking),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            (c,) = await complete(http, engine, [pair])
        except ClientGone:
            return Response(status_code=499)
        except GenerationFailed as exc:
            return anthropic_error(500, str(exc))
        except GGFlowError as exc:
            return anthropic_error(_status_of(exc), str(exc))
        except Exception as exc:   # the loading server's refusal is not a GGFlowError
            from ggflow.serving.app import _Unavailable
            if isinstance(exc, _Unavailable):
                return anthropic_error(503, str(exc))
            raise
        reasoning, text = split_reasoning(c.text, "auto", prep.in_think, keep_reasoning=thinking)
        content: list[dict[str, Any]] = []
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        calls = []
        if prep.tools is not None:
            message, _ = prep.tools.reply(text, c.finish_reason)
            text, calls = message.get("content") or "", message.get("tool_calls") or []
        if text or not calls:
            content.append({"type": "text", "text": text})
        content += [_tool_use_block(call) for call in calls]
        reason, seq = _stop_reason(engine.vocab, c, body.stops(), bool(calls))
        return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                "model": body.model or state.model_name, "content": content, "stop_reason": reason,
                "stop_sequence": seq, "usage": _usage(c)}

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(http: HTTPRequest):
        try:
            body = await parse(http, CountTokensBody)
            engine = state.ready()
            return {"input_tokens": len(_prepare(state, engine, body).tokens)}
        except GGFlowError as exc:
            return anthropic_error(_status_of(exc), str(exc))


def _event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


async def _stream(pair: tuple, prep: PreparedChat, body: MessagesBody, model: str, vocab: Any, thinking: bool):
    """message_start, then per block content_block_start / _delta / _stop, message_delta, message_stop."""
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    yield _event("message_start", {"message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": body.model or model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": len(prep.tokens), "output_tokens": 0, "cache_read_input_tokens": 0}}})
    splitter = ReasoningSplitter(True, prep.in_think, keep_reasoning=thinking)
    calls = prep.tools.stream() if prep.tools is not None else None
    index, open_kind = -1, None

    def deltas(reasoning: str, text: str):
        nonlocal index, open_kind
        if text and calls is not None:
            text = calls.feed(text)
        for kind, value in (("thinking", reasoning), ("text", text)):
            if not value:
                continue
            if open_kind != kind:
                if open_kind is not None:
                    yield _event("content_block_stop", {"index": index})
                index, open_kind = index + 1, kind
                block = {"type": "thinking", "thinking": ""} if kind == "thinking" else {"type": "text", "text": ""}
                yield _event("content_block_start", {"index": index, "content_block": block})
            delta = ({"type": "thinking_delta", "thinking": value} if kind == "thinking"
                     else {"type": "text_delta", "text": value})
            yield _event("content_block_delta", {"index": index, "delta": delta})

    try:
        async for event in pieces(*pair):
            if isinstance(event, Piece):
                for line in deltas(*splitter.feed(event.text)):
                    yield line
                continue
            c = event.completion
            for line in deltas(*splitter.finish()):
                yield line
            found = []
            if calls is not None:
                rest, found = calls.finish()
                calls = None
                for line in deltas("", rest):
                    yield line
            if index < 0 and not found:   # an empty reply still has its (empty) text block
                index, open_kind = 0, "text"
                yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            if open_kind is not None:
                yield _event("content_block_stop", {"index": index})
            for call in found:
                index += 1
                block = _tool_use_block(call.as_openai())
                yield _event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
                yield _event("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
                yield _event("content_block_stop", {"index": index})
            reason, seq = _stop_reason(vocab, c, body.stops(), bool(found))
            yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                           "usage": {"output_tokens": len(c.tokens)}})
            yield _event("message_stop", {})
    except GenerationFailed as exc:
        yield _event("error", {"error": {"type": "api_error", "message": str(exc)}})
