"""One request's round trip between an HTTP handler and the engine thread: plain JSON or server-sent events.

The engine calls ``on_event`` from its own thread; the loop's Mailbox (serving/handoff.py) moves the events
into the handler's asyncio queue, one wake-up of the loop for all that arrive together. A handler whose
client goes away cancels its request, and the engine frees the slot at its next step.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse

from ggflow.api import Completion
from ggflow.serving.rerank import check_can_generate
from ggflow.serving.engine import Engine
from ggflow.serving.handoff import Mailbox
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
    """The engine thread's events for one request, delivered into the handler's event loop.

    ``pieces`` False: only Done is delivered (a response that is not streamed waits for the whole text,
    and needs no wake-up per token).
    """

    def __init__(self, pieces: bool = True) -> None:
        self.mailbox = Mailbox.of_running_loop()
        self.queue: asyncio.Queue[Piece | Done] = asyncio.Queue()
        self.pieces = pieces

    def on_event(self, event: Piece | Done) -> None:
        if self.pieces or isinstance(event, Done):
            self.mailbox.post(self.queue, event)

    async def next_events(self) -> list[Piece | Done]:
        """What has arrived: at least one event (waits for it), and whatever else is already queued."""
        events = [await self.queue.get()]
        while not self.queue.empty():
            events.append(self.queue.get_nowait())
        return events


async def generate(http: HTTPRequest, engine: Engine, body: GenerationBody, tokens: list[int],
                   ids: ResponseIds, default_max_tokens: int, grammar: "Grammar | None" = None,
                   tools: "ToolCalling | None" = None) -> Any:
    """Submit the request; answer with the whole completion, or stream it (body.stream). ``grammar``
    constrains the output; ``tools`` turns a chat reply's tool-call syntax into OpenAI tool_calls."""
    check_can_generate(http, engine)   # an encoder, or a --embedding server: 400
    events = _Events(pieces=body.stream)
    request = Request(tokens, events.on_event, max_tokens=body.token_limit(default_max_tokens),
                      sampling=body.sampling(engine.vocab.special.eog), stop=body.stops(), grammar=grammar)
    engine.submit(request)   # raises the 400 / 503 refusals before anything is sent
    if body.stream:
        return StreamingResponse(_sse(events, request, ids, body.include_usage, tools),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    event: Piece | Done | None = None
    try:
        while not isinstance(event, Done):   # only Done comes (pieces=False): check the client meanwhile
            try:
                event = await asyncio.wait_for(events.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    break
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


def _closing_lines(ids: ResponseIds, done: Completion, include_usage: bool, calls: Any) -> list[str]:
    """After the last piece: held-back text and tool calls, the finishing chunk, usage if asked."""
    lines, finish = [], done.finish_reason
    if calls is not None:
        rest, found = calls.finish()
        if rest:
            lines.append(_sse_line(chunk(ids, rest)))
        if found:
            lines.append(_sse_line(tool_calls_chunk(ids, found)))
            finish = FINISH_TOOL_CALLS if finish == "stop" else finish
    lines.append(_sse_line(final_chunk(ids, done, finish)))
    if include_usage:
        lines.append(_sse_line(usage_chunk(ids, done)))
    return lines


async def _sse(events: _Events, request: Request, ids: ResponseIds, include_usage: bool,
               tools: "ToolCalling | None" = None) -> AsyncIterator[str]:
    """Server-sent events: one chunk per piece of text, the finishing chunk, usage if asked, [DONE].

    If the client goes away, Starlette cancels this generator: ``finally`` cancels the request, and the
    engine frees its slot at its next step.
    """
    done: Completion | None = None
    calls = tools.stream() if tools is not None else None   # holds back what may be a tool call
    try:
        first, ended = True, False
        while not ended:
            lines: list[str] = []          # one write for all that arrived together (several tokens, the end)
            for event in await events.next_events():
                if isinstance(event, Piece):
                    text = calls.feed(event.text) if calls is not None else event.text
                    if text or first:
                        lines.append(_sse_line(chunk(ids, text, first=first)))
                        first = False
                    continue
                ended = True
                if event.error is not None:
                    lines.append(_sse_line(error_body(event.error, "server_error", 500)))
                    break
                done = event.completion
                lines.extend(_closing_lines(ids, done, include_usage, calls))
                break
            if ended:
                lines.append("data: [DONE]\n\n")
            if lines:   # (a piece may release no text yet: a UTF-8 character or a stop string in progress)
                yield "".join(lines)
    finally:
        if done is None:
            request.cancel()
