"""Running one request for the routes that are not OpenAI chat/completions (llama-server's /completion and
/infill, Anthropic's /v1/messages, OpenAI's /v1/responses): submit, then wait for the Completion or iterate
the pieces. The client leaving cancels the request, as in serving/generation.py."""
from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import Request as HTTPRequest

from ggflow.errors import GGFlowError
from ggflow.generation.records import Completion
from ggflow.generation.request import Done, Piece, Request
from ggflow.serving.generation import _Events, _wait_done
from ggflow.serving.rerank import check_can_generate


class ClientGone(Exception):
    """The client closed the connection before the answer was ready (answered with 499)."""


class GenerationFailed(Exception):
    """The engine failed the request (a 500 with the engine's message)."""


def make_request(engine: Any, tokens: list[int], body: Any, default_max_tokens: int | None, stream: bool,
                 n_top: int | None = None, grammar: Any = None, stop: list[str] | None = None) -> tuple[Request, _Events]:
    """The engine Request for ``body`` (a GenerationBody) on ``tokens``, and the events it posts."""
    bad = [t for t in tokens if not 0 <= t < engine.vocab.n_vocab]
    if bad:
        raise GGFlowError(f"token id {bad[0]} is outside the vocabulary [0, {engine.vocab.n_vocab})")
    if not tokens:
        raise GGFlowError("the prompt is empty")
    events = _Events(pieces=stream)
    request = Request(tokens, events.on_event, max_tokens=body.token_limit(default_max_tokens),
                      sampling=body.sampling(engine.vocab.special.eog), stop=body.stops() if stop is None else stop,
                      grammar=grammar, n_top=n_top, id_slot=getattr(body, "id_slot", -1))
    return request, events


async def complete(http: HTTPRequest, engine: Any, requests: list[tuple[Request, _Events]]) -> list[Completion]:
    """Submit every request (they decode together) and wait for all of them."""
    check_can_generate(http, engine)
    for request, _ in requests:
        engine.submit(request)
    finished = 0
    try:
        out = []
        for _, events in requests:
            done = await _wait_done(http, events)
            if done is None:
                raise ClientGone()
            if done.error is not None:
                raise GenerationFailed(done.error)
            out.append(done.completion)
            finished += 1
        return out
    finally:
        if finished < len(requests):
            for request, _ in requests:
                request.cancel()


async def pieces(request: Request, events: _Events) -> AsyncIterator[Piece | Done]:
    """A submitted request's pieces, then its Done (GenerationFailed if the engine failed it); the request is
    cancelled if the consumer stops early (the client left)."""
    ended = False
    try:
        while not ended:
            for event in await events.next_events():
                if isinstance(event, Done):
                    ended = True
                    if event.error is not None:
                        raise GenerationFailed(event.error)
                yield event
                if ended:
                    break
    finally:
        if not ended:
            request.cancel()


def stop_type(vocab: Any, c: Completion, stops: list[str]) -> tuple[str, str]:
    """llama-server's stop_type (eos / word / limit) and stopping_word of a finished completion."""
    if c.finish_reason == "length":
        return "limit", ""
    if c.tokens and vocab.is_eog(c.tokens[-1]):
        return "eos", ""
    raw = vocab.detokenize(c.tokens)
    found = sorted((raw.find(s, max(0, len(c.text) - len(s))), s) for s in stops if s and s in raw)
    found = [f for f in found if f[0] >= 0]
    return ("word", found[0][1]) if found else ("eos", "")
