"""One request's round trip between an HTTP handler and the engine thread: plain JSON or server-sent events.

The engine calls ``on_event`` from its own thread; ``loop.call_soon_threadsafe`` moves each event into the
handler's asyncio queue. A handler whose client goes away cancels its request, and the engine frees the
slot at its next step.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse

from ggflow.api import Completion
from ggflow.serving.engine import Engine
from ggflow.serving.openai_params import GenerationBody
from ggflow.serving.request import Done, Piece, Request
from ggflow.serving.responses import (ResponseIds, chunk, error_body, error_response, final_chunk, full_response,
                                     tool_calls_chunk, usage_chunk)
from ggflow.structured.chat_tools import FINISH_TOOL_CALLS

if TYPE_CHECKING:
    from ggflow.structured import Grammar
    from ggflow.structured.chat_tools import ToolCalling

DISCONNECT_POLL_S = 0.5              # how often a waiting non-streamed request checks for its client


class _Events:
    """The engine thread's events for one request, delivered into the handler's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Piece | Done] = asyncio.Queue()

    def on_event(self, event: Piece | Done) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


async def generate(http: HTTPRequest, engine: Engine, body: GenerationBody, tokens: list[int],
                   ids: ResponseIds, default_max_tokens: int, grammar: "Grammar | None" = None,
                   tools: "ToolCalling | None" = None) -> Any:
    """Submit the request; answer with the whole completion, or stream it (body.stream). ``grammar``
    constrains the output; ``tools`` turns a chat reply's tool-call syntax into OpenAI tool_calls."""
    events = _Events()
    request = Request(tokens, events.on_event, max_tokens=body.token_limit(default_max_tokens),
                      sampling=body.sampling(engine.vocab.special.eog), stop=body.stops(), grammar=grammar)
    engine.submit(request)   # raises the 400 / 503 refusals before anything is sent
    if body.stream:
        return StreamingResponse(_sse(events, request, ids, body.include_usage, tools),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    event: Piece | Done | None = None
    next_check = time.monotonic() + DISCONNECT_POLL_S
    try:
        while not isinstance(event, Done):
            try:
                event = await asyncio.wait_for(events.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                pass
            if time.monotonic() >= next_check:   # pieces arrive faster than any timeout: check by the clock
                if await http.is_disconnected():
                    break
                next_check = time.monotonic() + DISCONNECT_POLL_S
    finally:
        if not isinstance(event, Done):   # the handler was cancelled: nobody will read the result
            request.cancel()
    if not isinstance(event, Done):
        return Response(status_code=499)   # nobody is listening any more (nginx's "client closed request")
    if event.error is not None:
        return error_response(500, event.error, "server_error")
    return full_response(ids, event.completion, tools)


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _sse(events: _Events, request: Request, ids: ResponseIds, include_usage: bool,
               tools: "ToolCalling | None" = None) -> AsyncIterator[str]:
    """Server-sent events: one chunk per piece of text, the finishing chunk, usage if asked, [DONE].

    If the client goes away, Starlette cancels this generator: ``finally`` cancels the request, and the
    engine frees its slot at its next step.
    """
    done: Completion | None = None
    calls = tools.stream() if tools is not None else None   # holds back what may be a tool call
    try:
        first = True
        while done is None:
            event = await events.queue.get()
            if isinstance(event, Piece):
                text = calls.feed(event.text) if calls is not None else event.text
                if text or first:
                    yield _sse_line(chunk(ids, text, first=first))
                    first = False
                continue
            if event.error is not None:
                yield _sse_line(error_body(event.error, "server_error", 500))
                break
            done = event.completion
            finish = done.finish_reason
            if calls is not None:
                rest, found = calls.finish()
                if rest:
                    yield _sse_line(chunk(ids, rest))
                if found:
                    yield _sse_line(tool_calls_chunk(ids, found))
                    finish = FINISH_TOOL_CALLS if finish == "stop" else finish
            yield _sse_line(final_chunk(ids, done, finish))
            if include_usage:
                yield _sse_line(usage_chunk(ids, done))
        yield "data: [DONE]\n\n"
    finally:
        if done is None:
            request.cancel()
