"""The OpenAI-compatible HTTP app on an engine (FastAPI): the routes llama-server and OpenAI name.

Handlers never touch the model: they tokenize (the vocab is read-only), submit a Request and read its
events from an asyncio queue the engine thread feeds through ``loop.call_soon_threadsafe``.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ggflow.api.arguments import check_messages
from ggflow.core.sampling import SamplingParams
from ggflow.errors import GGFlowError
from ggflow.structured.chat_tools import ToolCalling
from ggflow.serving.chat import chat_prompt_tokens
from ggflow.serving.chat_page import add_chat_page
from ggflow.serving.engine import Engine
from ggflow.serving.embeddings import embedding_job
from ggflow.serving.openai_params import (ChatCompletionBody, CompletionBody, DetokenizeBody, EmbeddingBody,
                                          TokenizeBody)
from ggflow.serving.prometheus import metrics_text
from ggflow.serving.lora import add_lora_routes
from ggflow.serving.rerank import add_rerank_routes
from ggflow.serving.llama_routes import (add_llama_routes, props_generation_settings, slot_file_action,
                                         tokenize_with_pieces)
from ggflow.serving.anthropic import add_anthropic_routes
from ggflow.serving.responses_api import add_responses_routes
from ggflow.serving.reasoning import ReasoningOptions, prompt_opens_thinking
from ggflow.serving.generation import generate
from ggflow.serving.offload import SMALL_BODY_BYTES, off_loop
from ggflow.serving.limits import BodyLimits, BodyTimeoutError, BodyTooLargeError, ServerLimits
from ggflow.serving.request import EngineStoppedError, PromptTooLongError, QueueFullError
from ggflow.serving.responses import ResponseIds, error_response

COMPLETION_DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions; chat runs to the end


@dataclass
class ServerState:
    """What the routes need; ``engine`` is None while the model loads (/health says 503)."""
    model_name: str
    api_key: str | None = None
    engine: Engine | None = None
    load_error: str | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    reasoning_format: str = "auto"       # --reasoning-format: a chat request's default (serving/reasoning.py)
    reasoning: str = "auto"              # --reasoning on / off / auto: thinking by default, or not
    slot_save_path: str | None = None    # --slot-save-path: where /slots/{id}?action=save|restore keep files
    chat_template_file: str | None = None   # --chat-template-file: a Jinja template instead of the GGUF's
    created: int = field(default_factory=lambda: int(time.time()))
    _template: Any = None

    def chat_template(self) -> Any:
        if self._template is None:
            from ggflow.core.chat_template import ChatTemplate
            model = self.ready().ctx.model
            source = model.metadata.get("tokenizer.chat_template")
            if self.chat_template_file is not None:
                from ggflow.serving.llama_routes import read_template_file
                source = read_template_file(self.chat_template_file)
            self._template = ChatTemplate.for_vocab(source, model.vocab)
        return self._template

    def ready(self) -> Engine:
        if self.engine is None:
            raise _Unavailable(self.load_error or "Loading model")
        return self.engine


class _Unavailable(Exception):
    pass


class _Unauthorized(Exception):
    pass


def create_app(state: ServerState) -> FastAPI:
    async def require_api_key(request: HTTPRequest) -> None:
        """A dependency of every route (/health exempt), so a refusal goes through the error handlers."""
        if state.api_key and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
                raise _Unauthorized("Invalid API Key")

    # the schema is a route of ours (below), so it needs the key like every other route
    app = FastAPI(title="ggflow", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(require_api_key)])
    app.state.ggflow = state
    app.add_middleware(BodyLimits, limits=lambda: state.limits)
    _install_error_handlers(app)

    @app.get("/health")
    async def health():
        if state.engine is None:
            return error_response(503, state.load_error or "Loading model", "unavailable_error")
        return {"status": "ok"}

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_schema():
        return app.openapi()

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
                "default_generation_settings": {**dataclasses.asdict(SamplingParams()),
                                                **props_generation_settings(engine)}}

    @app.get("/metrics")
    async def metrics():
        engine = state.ready()
        return Response(metrics_text(engine.metrics.snapshot), media_type="text/plain; version=0.0.4")

    @app.get("/slots")
    async def slots():
        return state.ready().slots_snapshot()

    @app.post("/slots/{slot_id}")
    async def slot_action(http: HTTPRequest, slot_id: int, action: str = ""):
        if action in ("save", "restore"):
            return await slot_file_action(http, state, slot_id, action)
        if action != "erase":
            raise GGFlowError(f"unknown slot action {action!r}: ggflow supports ?action=save, restore or erase")
        n = await asyncio.wrap_future(state.ready().erase_slot(slot_id))
        return {"id_slot": slot_id, "n_erased": n}

    @app.post("/tokenize")
    async def tokenize(http: HTTPRequest):
        body = await _parse(http, TokenizeBody)
        vocab = state.ready().vocab

        def answer() -> bytes:   # tokens and their JSON (FastAPI's encoder walks a list item by item) off the loop
            tokens = vocab.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
            return json.dumps({"tokens": tokenize_with_pieces(vocab, tokens) if body.with_pieces else tokens}).encode()
        return Response(await off_loop(answer), media_type="application/json")

    @app.post("/detokenize")
    async def detokenize(http: HTTPRequest):
        body = await _parse(http, DetokenizeBody)
        vocab = state.ready().vocab
        bad = [t for t in body.tokens if not 0 <= t < vocab.n_vocab]
        if bad:
            raise GGFlowError(f"token id {bad[0]} is outside the vocabulary [0, {vocab.n_vocab})")
        return {"content": await off_loop(vocab.detokenize, body.tokens)}

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
        tokens = await off_loop(engine.vocab.tokenize, prompt) if isinstance(prompt, str) else list(prompt)
        body = _capped(body, COMPLETION_DEFAULT_MAX_TOKENS, state.limits, engine.n_ctx)
        return await generate(http, engine, body, tokens, ResponseIds(False, state.model_name),
                              COMPLETION_DEFAULT_MAX_TOKENS, grammar=await off_loop(body.constraint),
                              prompt_text=prompt if isinstance(prompt, str) else engine.vocab.detokenize(tokens))

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(http: HTTPRequest):
        body = await _parse(http, EmbeddingBody)
        engine = state.ready()
        token_lists = await off_loop(body.token_lists, engine.vocab, engine.n_ctx)
        vectors = await asyncio.wrap_future(engine.run_side(embedding_job(engine, token_lists)))
        n = sum(len(t) for t in token_lists)
        if body.encoding_format == "base64":   # what the openai client asks for: little-endian float32 bytes
            vectors = [base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() for v in vectors]
        return {"object": "list", "model": state.model_name,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(http: HTTPRequest):
        body = await _parse(http, ChatCompletionBody)
        engine = state.ready()

        reasoning = ReasoningOptions.for_request(body, state.reasoning_format, state.reasoning)
        kwargs = reasoning.template_kwargs(body.chat_template_kwargs)

        def prompt() -> tuple[Any, Any, list[int]]:   # template, grammar, tokens: off the event loop
            template = state.chat_template()
            tools = ToolCalling.for_request(body.tools, body.tool_choice, body.parallel_tool_calls, template.source)
            grammar = body.constraint()
            messages = check_messages(body.messages)   # LLM's rules: roles, text parts only (an image is a 400)
            if tools is not None:
                tool_grammar = tools.grammar()
                if grammar is not None and tool_grammar is not None:
                    raise GGFlowError("a request with tools cannot also set grammar, json_schema or response_format")
                grammar = grammar or tool_grammar
                messages = tools.messages(messages)
            return tools, grammar, chat_prompt_tokens(template, engine.vocab, messages, tools=body.tools, **kwargs)
        tools, grammar, tokens = await off_loop(prompt)
        reasoning.in_think = prompt_opens_thinking(engine.vocab.detokenize(tokens[-8:], unparse_special=True))
        body = _capped(body, engine.n_ctx, state.limits, engine.n_ctx)
        return await generate(http, engine, body, tokens, ResponseIds(True, state.model_name), engine.n_ctx,
                              grammar=grammar, tools=tools, reasoning=reasoning if reasoning.active else None)

    add_rerank_routes(app, state, _parse)
    add_chat_page(app)
    add_lora_routes(app, state)
    add_llama_routes(app, state, _parse)
    add_anthropic_routes(app, state, _parse)
    add_responses_routes(app, state, _parse)
    return app


class _BadBody(GGFlowError):
    pass


_Body = TypeVar("_Body", bound=BaseModel)


async def _parse(http: HTTPRequest, model: type[_Body]) -> _Body:
    """The JSON body as ``model``, whatever the Content-Type says (curl -d sends form encoding); a large one
    is parsed off the event loop (serving/offload.py)."""
    raw = await http.body()
    return _decode(raw, model) if len(raw) < SMALL_BODY_BYTES else await off_loop(_decode, raw, model)


def _decode(raw: bytes, model: type[_Body]) -> _Body:
    try:
        data = json.loads(raw or b"null", parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise _BadBody("the request body is nested too deeply") from None
    except ValueError as exc:   # bad JSON or UTF-8; an integer of more than 4300 digits (int_max_str_digits)
        raise _BadBody(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _BadBody(f"the request body must be a JSON object, got {type(data).__name__}")
    try:   # JSON may escape a lone UTF-16 surrogate ("\\ud800"): a str no tokenizer can encode
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise _BadBody("the request body is nested too deeply") from None
    except UnicodeEncodeError:
        raise _BadBody("the request body has a lone UTF-16 surrogate escape (\\ud800-\\udfff): not text") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _BadBody("invalid request: " + "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in exc.errors())) from None


def _no_constant(name: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity; JSON has no such numbers."""
    raise _BadBody(f"the request body is not valid JSON: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):   # 1e400 reads as inf
        raise _BadBody(f"the request body has a number out of range: {text[:40]}")
    return value


def _capped(body: _Body, default_max_tokens: int, limits: ServerLimits, n_ctx: int) -> _Body:
    """As llama-server's -n: a request asking for more tokens than the cap (or for no limit) gets the cap."""
    if limits.max_tokens_cap is None:
        return body
    wanted = body.token_limit(default_max_tokens, n_ctx)  # type: ignore[attr-defined]
    return body.model_copy(update={"max_completion_tokens": limits.cap_tokens(wanted)})


# exception -> (HTTP status, OpenAI error type); the first match wins, so subclasses come first
_ERRORS = ((PromptTooLongError, 400, "exceed_context_size_error"), (BodyTooLargeError, 413, "invalid_request_error"),
           (BodyTimeoutError, 408, "timeout_error"), (QueueFullError, 503, "unavailable_error"),
           (EngineStoppedError, 503, "unavailable_error"), (_Unavailable, 503, "unavailable_error"),
           (_Unauthorized, 401, "authentication_error"), (GGFlowError, 400, "invalid_request_error"))


def _install_error_handlers(app: FastAPI) -> None:
    async def handle(request: HTTPRequest, exc: Exception):
        status, kind = next((s, k) for t, s, k in _ERRORS if isinstance(exc, t))
        too_long = isinstance(exc, PromptTooLongError)
        extra = {"n_prompt_tokens": exc.n_prompt_tokens, "n_ctx": exc.n_ctx} if too_long else {}
        response = error_response(status, str(exc), kind, **extra)
        if isinstance(exc, (BodyTooLargeError, BodyTimeoutError)):   # the rest of the body is not read
            response.headers["connection"] = "close"
        return response

    async def handle_http(request: HTTPRequest, exc: StarletteHTTPException):
        """Starlette's own refusals (no such route, a method the route does not take) in OpenAI's shape."""
        where = f"{request.method} {request.url.path}"
        message = {404: f"{where}: no such route", 405: f"{where}: the route does not take {request.method}"}
        response = error_response(exc.status_code, message.get(exc.status_code, f"{where}: {exc.detail}"),
                                  "not_found_error" if exc.status_code == 404 else "invalid_request_error")
        response.headers.update(exc.headers or {})   # 405's Allow
        return response

    async def handle_validation(request: HTTPRequest, exc: RequestValidationError):
        """A path or query parameter of the wrong type (/slots/abc)."""
        return error_response(400, "invalid request: " + "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()),
            "invalid_request_error")

    for exc_type, _, _ in _ERRORS:
        app.add_exception_handler(exc_type, handle)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(RequestValidationError, handle_validation)
