"""The OpenAI-compatible HTTP app on an engine (FastAPI): the routes llama-server and OpenAI name.

Handlers never touch the model: they tokenize (the vocab is read-only), submit a Request and read its
events from an asyncio queue the engine thread feeds through ``loop.call_soon_threadsafe``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, TypeVar

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from ggflow.api import Completion
from ggflow.core.sampling import SamplingParams
from ggflow.errors import GGFlowError
from ggflow.serving.chat import chat_prompt_tokens
from ggflow.serving.engine import Engine
from ggflow.serving.openai_params import (ChatCompletionBody, CompletionBody, DetokenizeBody, TokenizeBody,
                                          _Generation)
from ggflow.serving.prometheus import metrics_text
from ggflow.serving.request import (Done, EngineStoppedError, Piece, PromptTooLongError, QueueFullError, Request)
from ggflow.serving.responses import (ResponseIds, chunk, error_body, final_chunk, full_response, usage_chunk)

COMPLETION_DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions; chat runs to the end
DISCONNECT_POLL_S = 0.5              # how often a waiting non-streamed request checks for its client


@dataclass
class ServerState:
    """What the routes need; ``engine`` is None while the model loads (/health says 503)."""
    model_name: str
    api_key: str | None = None
    engine: Engine | None = None
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    _template: Any = None

    def chat_template(self) -> Any:
        if self._template is None:
            from ggflow.core.chat_template import ChatTemplate
            model = self.ready().ctx.model
            self._template = ChatTemplate.for_vocab(model.metadata.get("tokenizer.chat_template"), model.vocab)
        return self._template

    def ready(self) -> Engine:
        if self.engine is None:
            raise _Unavailable(self.load_error or "Loading model")
        return self.engine


class _Unavailable(Exception):
    pass


class _Unauthorized(Exception):
    pass


def _error(status: int, message: str, kind: str, **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(message, kind, status, **extra), status_code=status)


def create_app(state: ServerState) -> FastAPI:
    async def require_api_key(request: HTTPRequest) -> None:
        """A dependency of every route (/health exempt), so a refusal goes through the error handlers."""
        if state.api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
                raise _Unauthorized("Invalid API Key")

    app = FastAPI(title="ggflow", docs_url=None, redoc_url=None, dependencies=[Depends(require_api_key)])
    app.state.ggflow = state
    _install_error_handlers(app)

    @app.get("/health")
    async def health():
        if state.engine is None:
            return _error(503, state.load_error or "Loading model", "unavailable_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "ggflow"}]}

    @app.get("/props")
    async def props():
        """llama-server's /props: what the server runs with."""
        engine = state.ready()
        return {"model_alias": state.model_name, "model_path": engine.ctx.model.path, "total_slots": len(engine.slots),
                "n_ctx": engine.n_ctx, "n_batch": engine.n_batch, "max_queue": engine.max_queue,
                "chat_template": state.chat_template().source,
                "default_generation_settings": dataclasses.asdict(SamplingParams())}

    @app.get("/metrics")
    async def metrics():
        engine = state.ready()
        return Response(metrics_text(engine.metrics.snapshot), media_type="text/plain; version=0.0.4")

    @app.get("/slots")
    async def slots():
        return state.ready().slots_snapshot()

    @app.post("/slots/{slot_id}")
    async def slot_action(slot_id: int, action: str = ""):
        if action != "erase":
            raise GGFlowError(f"unknown slot action {action!r}: ggflow supports ?action=erase")
        n = await asyncio.wrap_future(state.ready().erase_slot(slot_id))
        return {"id_slot": slot_id, "n_erased": n}

    @app.post("/tokenize")
    async def tokenize(http: HTTPRequest):
        body = await _parse(http, TokenizeBody)
        vocab = state.ready().vocab
        return {"tokens": vocab.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)}

    @app.post("/detokenize")
    async def detokenize(http: HTTPRequest):
        body = await _parse(http, DetokenizeBody)
        vocab = state.ready().vocab
        bad = [t for t in body.tokens if not 0 <= t < vocab.n_vocab]
        if bad:
            raise GGFlowError(f"token id {bad[0]} is outside the vocabulary [0, {vocab.n_vocab})")
        return {"content": vocab.detokenize(body.tokens)}

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(http: HTTPRequest):
        body = await _parse(http, CompletionBody)
        engine = state.ready()
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise GGFlowError(f"{len(prompt)} prompts in one request are not supported: send one per request")
            prompt = prompt[0]
        tokens = engine.vocab.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return await _generate(http, engine, body, tokens, ResponseIds(False, state.model_name),
                               COMPLETION_DEFAULT_MAX_TOKENS)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(http: HTTPRequest):
        body = await _parse(http, ChatCompletionBody)
        engine = state.ready()
        tokens = chat_prompt_tokens(state.chat_template(), engine.vocab, body.messages)
        return await _generate(http, engine, body, tokens, ResponseIds(True, state.model_name), engine.n_ctx)

    return app


class _BadBody(GGFlowError):
    pass


_Body = TypeVar("_Body", bound=BaseModel)


async def _parse(http: HTTPRequest, model: type[_Body]) -> _Body:
    """The JSON body as ``model``, whatever the Content-Type says (curl -d sends form encoding)."""
    raw = await http.body()
    try:
        data = json.loads(raw or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadBody(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _BadBody(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _BadBody("invalid request: " + "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in exc.errors())) from None


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PromptTooLongError)
    async def too_long(request: HTTPRequest, exc: PromptTooLongError):
        return _error(400, str(exc), "exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens,
                      n_ctx=exc.n_ctx)

    @app.exception_handler(QueueFullError)
    @app.exception_handler(EngineStoppedError)
    async def busy(request: HTTPRequest, exc: GGFlowError):
        return _error(503, str(exc), "unavailable_error")

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: HTTPRequest, exc: _Unauthorized):
        return _error(401, str(exc), "authentication_error")

    @app.exception_handler(_Unavailable)
    async def loading(request: HTTPRequest, exc: _Unavailable):
        return _error(503, str(exc), "unavailable_error")

    @app.exception_handler(GGFlowError)
    async def bad_request(request: HTTPRequest, exc: GGFlowError):
        return _error(400, str(exc), "invalid_request_error")


# -- generation ------------------------------------------------------------------------------------
class _Events:
    """The engine thread's events for one request, delivered into the handler's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Piece | Done] = asyncio.Queue()

    def on_event(self, event: Piece | Done) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


async def _generate(http: HTTPRequest, engine: Engine, body: _Generation, tokens: list[int],
                    ids: ResponseIds, default_max_tokens: int):
    events = _Events()
    request = Request(tokens, events.on_event, max_tokens=body.token_limit(default_max_tokens),
                      sampling=body.sampling(engine.vocab.special.eog), stop=body.stops())
    engine.submit(request)   # raises the 400 / 503 refusals before anything is sent
    if body.stream:
        return StreamingResponse(_sse(events, request, ids, body.include_usage), media_type="text/event-stream",
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
        return _error(500, event.error, "server_error")
    return full_response(ids, event.completion)


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _sse(events: _Events, request: Request, ids: ResponseIds, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: one chunk per piece of text, the finishing chunk, usage if asked, [DONE].

    If the client goes away, Starlette cancels this generator: ``finally`` cancels the request, and the
    engine frees its slot at its next step.
    """
    done: Completion | None = None
    try:
        first = True
        while done is None:
            event = await events.queue.get()
            if isinstance(event, Piece):
                if event.text or first:
                    yield _sse_line(chunk(ids, event.text, first=first))
                    first = False
                continue
            if event.error is not None:
                yield _sse_line(error_body(event.error, "server_error", 500))
                break
            done = event.completion
            yield _sse_line(final_chunk(ids, done))
            if include_usage:
                yield _sse_line(usage_chunk(ids, done))
        yield "data: [DONE]\n\n"
    finally:
        if done is None:
            request.cancel()
