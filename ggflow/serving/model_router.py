"""Many models behind one server (llama-server's router mode), and a single model that sleeps when idle.

``install_router(app, pool)`` puts ASGI middleware inside the app's body limits: it reads a request's ``model``
(the JSON body's field; ``?model=`` on a GET), acquires that model from the pool -- loading it, evicting the
least recently used idle one -- and makes it the request's model for the handlers: ``RouterState`` answers
``ready()``, ``chat_template()`` and ``model_name`` from a context variable the middleware sets, so the routes
of app.py run unchanged on whichever engine was picked. The model counts as in flight until the response
(streamed or not) has been sent.

Routes of its own, ahead of app.py's: ``GET /v1/models`` (every model with its status), ``POST /models/load``,
``POST /models/unload``, ``GET /props`` and ``GET /health``, which never wake a sleeping model (llama-server's
list of routes exempt from waking: /health, /props, /models, /metrics).
"""
from __future__ import annotations

import contextvars
import json
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request as HTTPRequest
from pydantic import BaseModel, ConfigDict

from ggflow.errors import GGFlowError
from ggflow.serving.app import ServerState, _parse, _Unavailable
from ggflow.serving.limits import BodyTimeoutError, BodyTooLargeError
from ggflow.serving.model_pool import LoadedModel, ModelLoadFailed, ModelPool, ModelsBusyError, UnknownModelError
from ggflow.serving.responses import error_response

_current: contextvars.ContextVar[LoadedModel | None] = contextvars.ContextVar("ggflow_model", default=None)

# GETs that answer without waking (or loading) a model; the chat page's files need no model either
_NO_WAKE = ("/health", "/props", "/models", "/v1/models", "/metrics")


class RouterState(ServerState):
    """ServerState whose engine, chat template and model name are the current request's model's."""
    pool: ModelPool

    @property   # type: ignore[override]
    def engine(self) -> Any:
        entry = _current.get()
        return entry.engine if entry is not None else None

    @engine.setter
    def engine(self, value: Any) -> None:   # ServerState's __init__ sets None; engines come from the pool
        pass

    @property   # type: ignore[override]
    def model_name(self) -> str:
        entry = _current.get()
        return entry.name if entry is not None else self._default_name

    @model_name.setter
    def model_name(self, value: str) -> None:
        self._default_name = value

    def ready(self) -> Any:
        entry = _current.get()
        if entry is None:
            raise GGFlowError(f"name a model (?model= on a GET): this server serves {', '.join(self.pool.names)}")
        if entry.engine is None:
            raise _Unavailable(f"model {entry.name!r} is not loaded ({entry.status})")
        return entry.engine

    def chat_template(self) -> Any:
        engine = self.ready()
        return _current.get().chat_template(engine)


class _ModelBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: str


# the router's refusals -> (HTTP status, OpenAI error type)
_REFUSALS = ((UnknownModelError, 404, "not_found_error"), (ModelsBusyError, 503, "unavailable_error"),
             (ModelLoadFailed, 503, "unavailable_error"), (BodyTooLargeError, 413, "invalid_request_error"),
             (BodyTimeoutError, 408, "timeout_error"), (GGFlowError, 400, "invalid_request_error"))


def install_router(app: FastAPI, state: RouterState, pool: ModelPool) -> None:
    """The middleware and the router's routes on an app create_app made from ``state``."""
    from starlette.middleware import Middleware

    state.pool = pool
    app.user_middleware.append(Middleware(ModelRouting, pool=pool, routes=app.router.routes))   # inside BodyLimits
    n_routes = len(app.router.routes)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return {"object": "list", "data": pool.listing(state.created)}

    @app.post("/models/load")
    async def load(http: HTTPRequest):
        body = await _parse(http, _ModelBody)
        await pool.load(body.model)
        return {"success": True}

    @app.post("/models/unload")
    async def unload(http: HTTPRequest):
        body = await _parse(http, _ModelBody)
        if not await pool.unload(body.model):
            raise GGFlowError(f"model {body.model!r} is not loaded")
        return {"success": True}

    @app.get("/props")
    async def props(model: str | None = None):
        if model is None and not pool.single and len(pool.models) > 1:
            return {"role": "router", "max_instances": pool.max_loaded, "models_autoload": True,
                    "models": pool.names}
        entry = pool.get(model)
        props = {"role": "model", "model_alias": entry.name, "model_path": entry.spec.path,
                 "is_sleeping": entry.status == "sleeping", "status": entry.status}
        engine = entry.engine
        if engine is not None:
            props.update(total_slots=len(engine.slots), n_ctx=engine.n_ctx, n_batch=engine.n_batch,
                         max_queue=engine.max_queue, chat_template=entry.chat_template(engine).source)
        return props

    for exc_type, status, kind in _REFUSALS[:3]:
        app.add_exception_handler(exc_type, _refusal_handler(status, kind))
    ours = app.router.routes[n_routes:]   # ahead of app.py's routes of the same paths
    del app.router.routes[n_routes:]
    app.router.routes[0:0] = ours


def _refusal_handler(status: int, kind: str):
    async def handle(request: HTTPRequest, exc: Exception):
        return error_response(status, str(exc), kind)
    return handle


class ModelRouting:
    """ASGI middleware: the request's model, acquired for as long as the request runs."""

    def __init__(self, app: Any, pool: ModelPool, routes: list):
        self.app, self.pool, self.routes = app, pool, routes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _free(scope) or not self._routed(scope):
            return await self._peek(scope, receive, send)
        try:
            receive, name = await _model_of(scope, receive)
            entry = await self.pool.acquire(name)
        except GGFlowError as exc:
            status, kind = next((s, k) for t, s, k in _REFUSALS if isinstance(exc, t))
            response = error_response(status, str(exc), kind)
            if status in (408, 413):
                response.headers["connection"] = "close"
            return await response(scope, receive, send)
        token = _current.set(entry)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
            self.pool.release(entry)

    def _routed(self, scope: dict) -> bool:
        """Whether a route takes this request (a 404 or 405 needs no model, and wakes none)."""
        from starlette.routing import Match

        return any(route.matches(scope)[0] == Match.FULL for route in self.routes)

    async def _peek(self, scope: dict, receive: Any, send: Any) -> None:
        """A route that must not wake a model sees it only when it is loaded."""
        entry = None
        if scope["type"] == "http":
            try:
                entry = self.pool.get(_query_model(scope))
            except GGFlowError:
                entry = None
        token = _current.set(entry)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)


def _free(scope: dict) -> bool:
    """Requests that need no model: the no-wake GETs, the chat page's files, the router's own routes."""
    path, method = scope["path"], scope["method"]
    if path in ("/models/load", "/models/unload"):
        return True
    return method in ("GET", "HEAD") and (path in _NO_WAKE or path == "/" or path.startswith("/static/"))


def _query_model(scope: dict) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("model")
    return values[0] if values else None


async def _model_of(scope: dict, receive: Any) -> tuple[Any, str | None]:
    """The request's model name (?model=, else the JSON body's "model"), and a receive that replays the body."""
    name = _query_model(scope)
    if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return receive, name
    messages, more = [], True
    while more:
        message = await receive()
        messages.append(message)
        more = message["type"] == "http.request" and message.get("more_body", False)
    if name is None:
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        try:
            data = json.loads(body or b"null")
        except (ValueError, RecursionError):
            data = None   # the route's own parse says what is wrong with it
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            name = data["model"]
    pending = list(messages)

    async def replay() -> dict:
        return pending.pop(0) if pending else await receive()
    return replay, name
