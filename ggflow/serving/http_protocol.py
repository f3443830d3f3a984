"""uvicorn's h11 protocol with the limits of one connection (``ConnectionLimits``): what a client may cost the
server before a handler ever runs.

uvicorn alone gives a connection that sends nothing, or half its headers, no deadline at all (its keep-alive
timer starts only after a first response, and any byte stops it), reads headers of any size with httptools
(256 MiB of one header cost 510 MiB and 73 s of CPU), and accepts connections until file descriptors run out.
Here:

- the request line and headers are at most ``max_header_bytes`` (h11's incomplete-event limit, and the sum of
  a complete header block that came in one read) and ``max_headers`` fields: past either, 431 and closed;
- from a connection's start, or the end of its previous response, a request's headers must be complete within
  ``header_timeout_s``: a silent connection is closed, a partial request gets 408 and is closed. A body the
  app never read counts against the same deadline; a body the app reads has ``ServerLimits.body_timeout_s``;
- idle between requests: closed after ``keep_alive_s`` (uvicorn's ``timeout_keep_alive``);
- past ``max_connections`` open at once, a new connection gets 503 and is closed before anything is read.

Refusals have OpenAI's error shape and ``Connection: close``.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ggflow.serving.limits import ConnectionLimits

log = logging.getLogger("ggflow.serving")


def refusal_bytes(status: int, reason: str, message: str, kind: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI error body, that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n")
    return head.encode("ascii") + body


class _LimitedConnection(h11.Connection):
    """h11's server connection that also refuses a header block past the limits once it is complete."""

    def __init__(self, limits: ConnectionLimits, on_request: Callable[[], None]):
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.limits, self.on_request = limits, on_request
        self.refusal: tuple[int, str] | None = None   # what send_400_response answers

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refusal = ((431, self._too_large()) if exc.error_status_hint == 431
                            else (400, f"the request is not valid HTTP/1.1: {exc}"))
            raise
        if isinstance(event, h11.Request):
            size = len(event.method) + len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
            if len(event.headers) > self.limits.max_headers:
                self.refusal = (431, f"the request has {len(event.headers)} header fields; this server takes at "
                                     f"most {self.limits.max_headers} (--max-headers)")
                raise h11.RemoteProtocolError("too many header fields", error_status_hint=431)
            if size > self.limits.max_header_bytes:
                self.refusal = (431, self._too_large())
                raise h11.RemoteProtocolError("header block too large", error_status_hint=431)
            self.on_request()
        return event

    def _too_large(self) -> str:
        return (f"the request line and headers exceed {self.limits.max_header_bytes} bytes "
                f"(--max-header-bytes)")


class LimitedH11Protocol(H11Protocol):
    """One connection; ``limits`` is set on the subclass ``protocol_for`` makes."""
    limits = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _LimitedConnection(self.limits, self._headers_complete)
        self.timeout_keep_alive = self.limits.keep_alive_s
        self._header_deadline: asyncio.TimerHandle | None = None

    # -- the connection's lifetime ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            log.warning("refused a connection: %d are open (--max-connections %d)",
                        len(self.connections) - 1, self.limits.max_connections)
            self._refuse(503, "Service Unavailable", f"this server holds at most {self.limits.max_connections} "
                                                     f"connections (--max-connections); try again later",
                         "unavailable_error")
            return
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():   # armed first: a pipelined request's headers cancel it at once
            self._arm_header_deadline()
        super().on_response_complete()

    def shutdown(self) -> None:
        if self.transport.is_closing():   # refused: h11's state may not take a ConnectionClosed
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:
        status, message = self.conn.refusal or (400, msg)
        self._refuse(status, "Request Header Fields Too Large" if status == 431 else "Bad Request", message,
                     "invalid_request_error")

    # -- the header deadline ---------------------------------------------------------------------------
    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_deadline = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_complete(self) -> None:
        self._cancel_header_deadline()

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return
        if self.conn.their_state is not h11.IDLE or not self.conn.trailing_data[0]:
            self.transport.close()   # silent, or a body nobody reads after its response: nothing to answer
            return
        self._refuse(408, "Request Timeout", f"the request's headers were not complete within "
                                             f"{self.limits.header_timeout_s:g} s (--header-timeout)",
                     "timeout_error")

    def _refuse(self, status: int, reason: str, message: str, kind: str) -> None:
        self._unset_keepalive_if_required()
        self._cancel_header_deadline()
        self.transport.write(refusal_bytes(status, reason, message, kind))
        self.transport.close()


def protocol_for(limits: ConnectionLimits) -> type[LimitedH11Protocol]:
    """The protocol class uvicorn builds each connection with (uvicorn.Config's ``http``)."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": limits})


def uvicorn_config(app: Any, host: str, port: int, limits: ConnectionLimits | None = None,
                   **options: Any) -> uvicorn.Config:
    """uvicorn's Config for ``app`` with the connection limits (h11, whatever parser is installed)."""
    limits = limits or ConnectionLimits()
    return uvicorn.Config(app, host=host, port=port, http=protocol_for(limits), ws="none",
                          timeout_keep_alive=limits.keep_alive_s, h11_max_incomplete_event_size=limits.max_header_bytes,
                          **options)
