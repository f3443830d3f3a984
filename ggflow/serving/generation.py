"""One request's round trip between an HTTP handler and the engine thread: plain JSON or server-sent events.

The engine calls ``on_event`` from its own thread; the loop's Mailbox (serving/handoff.py) moves the events
into the handler's asyncio queue, one wake-up of the loop for all that arrive together. A handler whose
client goes away cancels its request, and the engine frees the slot at its next step.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse

from ggflow.core.sampling import SamplingParams
from ggflow.generation.engine import Engine
from ggflow.generation.records import Completion
from ggflow.generation.request import Done, Piece, Request
from ggflow.serving.rerank import check_can_generate
from ggflow.serving.reasoning import reasoning_chunk
from ggflow.serving.handoff import Mailbox
from ggflow.serving.lora import request_mix
from ggflow.serving.offload import off_loop
from ggflow.serving.openai_params import GenerationBody
from ggflow.serving.responses import (ChoiceShape, ResponseIds, chunk, error_body, error_response, final_chunk,
                                     full_response, tool_calls_chunk, usage_chunk)
from ggflow.structured.chat_tools import FINISH_TOOL_CALLS

if TYPE_CHECKING:
    from ggflow.structured import Grammar
    from ggflow.structured.chat_tools import ToolCalling
    from ggflow.serving.reasoning import ReasoningOptions

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
                   tools: "ToolCalling | None" = None, prompt_text: str | None = None,
                   reasoning: "ReasoningOptions | None" = None) -> Any:
    """Submit the request; answer with the whole completion, or stream it (body.stream). ``grammar``
    constrains the output; ``tools`` turns a chat reply's tool-call syntax into OpenAI tool_calls;
    ``prompt_text`` is what ``echo`` repeats. ``n`` > 1 choices continue from one evaluation of the prompt."""
    check_can_generate(http, engine)   # an encoder, or a --embedding server: 400
    n_top = body.top_logprobs_count(engine.vocab.n_vocab)
    echo = bool(getattr(body, "echo", False))
    shape = ChoiceShape(engine.vocab, n_top is not None, prompt_text if echo else None)
    sampling = body.sampling(engine.vocab.special.eog, engine.vocab.n_vocab)
    events = [_Events(pieces=body.stream) for _ in range(body.n)]
    requests = [Request(tokens, e.on_event, max_tokens=body.token_limit(default_max_tokens, engine.n_ctx),
                        sampling=_choice_seed(sampling, i), stop=body.stops(), grammar=grammar, n_top=n_top,
                        prompt_logprobs=echo and n_top is not None, lora=request_mix(body.lora))
                for i, e in enumerate(events)]
    requests[0].siblings = requests[1:]
    try:   # chains, grammars (DRY's breakers, llguidance) built off the loop; the 400 / 503 refusals raise here
        await off_loop(engine.submit, requests[0])
    except asyncio.CancelledError:   # the client left while it was being submitted
        requests[0].cancel()
        raise
    if body.stream:
        return StreamingResponse(_sse(events[0], requests[0], ids, body.include_usage, tools, shape, reasoning),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    done: list[Done] = []
    try:
        for e in events:
            event = await _wait_done(http, e)
            if event is None:
                return Response(status_code=499)   # nobody is listening any more (nginx's "client closed request")
            if event.error is not None:
                return error_response(500, event.error, "server_error")
            done.append(event)
    finally:
        if len(done) < len(requests):   # the handler was cancelled or failed: nobody will read the results
            for r in requests:
                r.cancel()
    completions = [d.completion for d in done]
    splits = [reasoning.split(c.text) for c in completions] if reasoning is not None else None
    if splits is not None:   # <think> text out of the content, before tool calls
        completions = [dataclasses.replace(c, text=s[1]) for c, s in zip(completions, splits)]
    out = full_response(ids, completions, tools, shape)
    for k, (choice, r) in enumerate(zip(out["choices"], requests)):
        if splits is not None and splits[k][0]:
            choice["message"]["reasoning_content"] = splits[k][0]
        if r.evicted:   # "length" because the shared KV cache was full, not because of max_tokens or n_ctx
            choice["evicted"] = True
    return out


async def _wait_done(http: HTTPRequest, events: _Events) -> Done | None:
    """The request's Done (only Done comes: pieces=False), checking the client meanwhile; None if it left."""
    while True:
        try:
            event = await asyncio.wait_for(events.queue.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                return None
            continue
        if isinstance(event, Done):
            return event


def _choice_seed(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice i of n samples with seed + i, so choices with a fixed seed still differ."""
    if index == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + index) & 0xFFFFFFFF)


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _closing_lines(ids: ResponseIds, done: Completion, include_usage: bool, calls: Any,
                   shape: ChoiceShape, evicted: bool = False) -> list[str]:
    """After the last piece: held-back text and tool calls, the finishing chunk, usage if asked."""
    lines, finish = [], done.finish_reason
    if calls is not None:
        rest, found = calls.finish()
        if rest:
            lines.append(_sse_line(chunk(ids, rest)))
        if found:
            lines.append(_sse_line(tool_calls_chunk(ids, found)))
            finish = FINISH_TOOL_CALLS if finish == "stop" else finish
    last = final_chunk(ids, done, finish)
    if evicted:
        last["choices"][0]["evicted"] = True
    lines.append(_sse_line(last))
    if include_usage:
        lines.append(_sse_line(usage_chunk(ids, done)))
    return lines


async def _sse(events: _Events, request: Request, ids: ResponseIds, include_usage: bool,
               tools: "ToolCalling | None", shape: ChoiceShape,
               reasoning: "ReasoningOptions | None" = None) -> AsyncIterator[str]:
    """Server-sent events: one chunk per piece of text, the finishing chunk, usage if asked, [DONE].

    If the client goes away, Starlette cancels this generator: ``finally`` cancels the request, and the
    engine frees its slot at its next step.
    """
    done: Completion | None = None
    calls = tools.stream() if tools is not None else None   # holds back what may be a tool call
    thoughts = reasoning.splitter() if reasoning is not None else None   # <think> text: reasoning_content
    try:
        first, ended = True, False
        if shape.echo is not None:
            yield _sse_line(chunk(ids, shape.echo))
        while not ended:
            lines: list[str] = []          # one write for all that arrived together (several tokens, the end)
            for event in await events.next_events():
                if isinstance(event, Piece):
                    text = event.text
                    if thoughts is not None:
                        thought, text = thoughts.feed(text)
                        if thought:
                            lines.append(_sse_line(reasoning_chunk(ids, thought, first)))
                            first = False
                    text = calls.feed(text) if calls is not None else text
                    lp = shape.piece_logprobs(event, ids.chat)
                    if text or first or lp is not None:
                        lines.append(_sse_line(chunk(ids, text, first=first, logprobs=lp)))
                        first = False
                    continue
                ended = True
                if event.error is not None:
                    lines.append(_sse_line(error_body(event.error, "server_error", 500)))
                    break
                done = event.completion
                if thoughts is not None:
                    thought, rest = thoughts.finish()
                    if thought:
                        lines.append(_sse_line(reasoning_chunk(ids, thought, first)))
                    rest = calls.feed(rest) if calls is not None and rest else rest
                    if rest:
                        lines.append(_sse_line(chunk(ids, rest)))
                lines.extend(_closing_lines(ids, done, include_usage, calls, shape, request.evicted))
                break
            if ended:
                lines.append("data: [DONE]\n\n")
            if lines:   # (a piece may release no text yet: a UTF-8 character or a stop string in progress)
                yield "".join(lines)
    finally:
        if done is None:
            request.cancel()
