"""What one request may cost the server: body size, time to send the body, tokens to generate; and what one
connection may hold (``ConnectionLimits``, enforced by serving/http_protocol.py).

``BodyLimits`` is ASGI middleware: a declared Content-Length past the limit is answered 413 before any byte
of the body is read; a body that grows past it while being read (chunked) raises ``BodyTooLargeError``, and
one still incomplete ``body_timeout_s`` after the request began raises ``BodyTimeoutError`` (408), both from
the handler's ``receive``, so the app's error handlers answer them. Once the body is complete, ``receive``
is the server's own again (streaming responses wait on it for a disconnect, as long as they run).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ggflow.errors import GGFlowError

try:
    from starlette.requests import ClientDisconnect
except ImportError:   # the CLI parses options without the server extra; no app runs then
    class ClientDisconnect(Exception):  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_HEADER_BYTES = 16 << 10     # h11's default; llama-server's (cpp-httplib) is 8 KiB
DEFAULT_MAX_HEADERS = 100               # Python's http.client and many proxies stop at 100 fields
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5.0              # uvicorn's and llama-server's
DEFAULT_MAX_CONNECTIONS = 512


class BodyTooLargeError(GGFlowError):
    """A request body past ``max_body_bytes`` (HTTP 413)."""


class BodyTimeoutError(GGFlowError):
    """A request body still incomplete ``body_timeout_s`` after the request began (HTTP 408)."""


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_tokens_cap: int | None = None   # llama-server's -n: a request asking for more gets this many

    def __post_init__(self):
        if self.max_body_bytes < 1:
            raise GGFlowError(f"max_body_bytes must be at least 1, got {self.max_body_bytes}")
        if not self.body_timeout_s > 0:
            raise GGFlowError(f"body_timeout_s must be > 0, got {self.body_timeout_s}")
        if self.max_tokens_cap is not None and self.max_tokens_cap < 1:
            raise GGFlowError(f"max_tokens_cap must be at least 1 (or None), got {self.max_tokens_cap}")

    def cap_tokens(self, n: int) -> int:
        return n if self.max_tokens_cap is None else min(n, self.max_tokens_cap)

    def too_large(self, n: int | str) -> str:
        return f"the request body has {n} bytes; this server takes at most {self.max_body_bytes} (--max-body-bytes)"


@dataclass(frozen=True)
class ConnectionLimits:
    """What one TCP connection may hold: its request line and headers (431 past them), the time from the
    connection's start (or its previous response's end) to a request's complete headers (408, then closed),
    its idle time between requests (closed), and how many connections may be open at once (503, closed)."""
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self):
        for name in ("max_header_bytes", "max_headers", "max_connections"):
            if getattr(self, name) < 1:
                raise GGFlowError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise GGFlowError(f"{name} must be > 0, got {getattr(self, name)}")


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimits:
    def __init__(self, app: Any, limits: Callable[[], ServerLimits]):
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limits = self.limits()
        declared = _content_length(scope)
        if declared is not None and declared > limits.max_body_bytes:
            from ggflow.serving.responses import error_response   # fastapi: the CLI parses options without it
            response = error_response(413, limits.too_large(declared), "invalid_request_error")
            return await response(scope, receive, send)
        try:
            await self.app(scope, _limited(receive, limits), send)
        except ClientDisconnect:   # nobody to answer: one line, not a traceback (the handler's work is undone)
            log.warning("%s %s: the client closed the connection before its body was complete",
                        scope.get("method"), scope.get("path"))


def _limited(receive: Receive, limits: ServerLimits) -> Receive:
    deadline = time.monotonic() + limits.body_timeout_s
    received, complete = 0, False

    async def limited_receive() -> dict[str, Any]:
        nonlocal received, complete
        if complete:
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            raise BodyTimeoutError(f"the request body was not complete within {limits.body_timeout_s:g} s "
                                   f"(--body-timeout)") from None
        if message["type"] != "http.request":   # the client went away
            complete = True
            return message
        received += len(message.get("body", b""))
        if received > limits.max_body_bytes:
            complete = True
            raise BodyTooLargeError(limits.too_large(f"more than {limits.max_body_bytes}"))
        complete = not message.get("more_body", False)
        return message
    return limited_receive


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None   # the server's parser refuses a malformed length before the app runs
    return None
