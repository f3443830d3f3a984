"""What one connection may cost ``ggflow serve`` (serving/http_protocol.py): header size and count (431), the
header deadline (408 or closed), idle keep-alive, slow and endless bodies (408/413, closed), the cap on open
connections (503), pipelining and HTTP/1.0 -- every socket closed within its deadline while a normal request
is answered throughout.

The app runs without a model (``/v1/models`` answers without one; ``/tokenize`` reads its body before it asks
for the engine), so these tests load nothing. Raw sockets on 127.0.0.1; every wait is bounded.
"""
from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
uvicorn = pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")

from ggflow.serving.app import ServerState, create_app  # noqa: E402
from ggflow.serving.http_protocol import uvicorn_config  # noqa: E402
from ggflow.serving.limits import ConnectionLimits, ServerLimits  # noqa: E402

HEADER_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 0.5
BODY_TIMEOUT_S = 1.0
SLACK_S = 1.5          # a loaded machine's scheduling, on top of each deadline
LIMITS = ConnectionLimits(max_header_bytes=8192, max_headers=50, header_timeout_s=HEADER_TIMEOUT_S,
                          keep_alive_s=KEEP_ALIVE_S, max_connections=400)


@contextlib.contextmanager
def running(limits: ConnectionLimits):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = ServerState(model_name="m", limits=ServerLimits(body_timeout_s=BODY_TIMEOUT_S))
    srv = uvicorn.Server(uvicorn_config(create_app(state), "127.0.0.1", port, limits, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def port():
    with running(LIMITS) as p:
        yield p


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (past limit_s: fail)."""
    start, data = time.monotonic(), b""
    sock.settimeout(0.2)
    while time.monotonic() - start < limit_s:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data, time.monotonic() - start
        if not chunk:
            return data, time.monotonic() - start
        data += chunk
    raise AssertionError(f"the connection was still open after {limit_s:g} s; received {data[:200]!r}")


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def error_of(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]


def assert_answers(port: int) -> None:
    """A normal request gets its normal answer."""
    r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "m"


GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


# -- headers: size and count ------------------------------------------------------------------------------
def test_a_header_that_never_ends_is_refused_431_after_a_bounded_read(port):
    sock = connect(port)
    sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nX-Bomb: ")
    sent, start = 0, time.monotonic()
    refused = False
    with sock:
        while sent < 64 << 20 and time.monotonic() - start < 30:   # 64 MiB at most
            try:
                sock.sendall(b"a" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                refused = True
                break
            sent += 65536
        assert refused, f"the server read {sent} bytes of one header without refusing it"
        assert sent < 4 << 20   # refused after the limit and the socket's buffers, not after the whole bomb
        sock.settimeout(5)
        try:
            response = sock.recv(65536)
        except ConnectionResetError:
            response = b""   # the refusal can be lost to the reset of a client still writing
    if response:
        assert status_of(response) == 431 and "max-header-bytes" in error_of(response)["message"]
    assert_answers(port)


def test_a_large_header_block_in_one_write_is_refused_431(port):
    with connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        response, _ = read_until_closed(sock, 5)
    assert status_of(response) == 431
    assert error_of(response)["code"] == 431 and b"connection: close" in response.lower()


def test_too_many_header_fields_are_refused_431(port):
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(LIMITS.max_headers + 1))
    with connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        response, _ = read_until_closed(sock, 5)
    assert status_of(response) == 431 and "max-headers" in error_of(response)["message"]


def test_headers_just_under_the_limits_are_served(port):
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(LIMITS.max_headers - 2))
    with connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fields + b"\r\n")
        response, _ = read_until_closed(sock, 5)
    assert status_of(response) == 200


# -- deadlines --------------------------------------------------------------------------------------------
def test_a_silent_connection_is_closed_at_the_header_deadline(port):
    with connect(port) as sock:
        response, took = read_until_closed(sock, HEADER_TIMEOUT_S + SLACK_S)
    assert response == b"" and took >= HEADER_TIMEOUT_S * 0.9


def test_headers_sent_a_byte_at_a_time_get_408_at_the_deadline(port):
    """Slowloris: each byte is activity, but the headers as a whole have a deadline."""
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    with connect(port) as sock:
        start = time.monotonic()
        for i in range(len(request)):
            try:
                sock.sendall(request[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            if time.monotonic() - start > HEADER_TIMEOUT_S + SLACK_S:
                break
            time.sleep(0.05)
        response, _ = read_until_closed(sock, HEADER_TIMEOUT_S + SLACK_S)
        took = time.monotonic() - start
    assert status_of(response) == 408 and error_of(response)["type"] == "timeout_error"
    assert took < HEADER_TIMEOUT_S + 2 * SLACK_S


def test_a_slow_body_gets_408_and_the_connection_closes(port):
    with connect(port) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"content\": \"")
        response, took = read_until_closed(sock, BODY_TIMEOUT_S + SLACK_S)
    assert status_of(response) == 408 and took >= BODY_TIMEOUT_S * 0.9


def test_a_chunked_body_that_never_ends_gets_408_and_the_connection_closes(port):
    with connect(port) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        start, response = time.monotonic(), b""
        sock.settimeout(0.1)
        while time.monotonic() - start < BODY_TIMEOUT_S + SLACK_S:   # a small chunk every 100 ms
            try:
                sock.sendall(b"1\r\na\r\n")
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            response += chunk
        else:
            raise AssertionError("the endless chunked body was still being read")
        if response and b"\r\n\r\n" not in response:
            response += read_until_closed(sock, SLACK_S)[0]
    assert status_of(response) == 408


def test_an_idle_keep_alive_connection_is_closed(port):
    with connect(port) as sock:
        sock.sendall(GET)
        response, took = read_until_closed(sock, KEEP_ALIVE_S + SLACK_S + 2)
    assert status_of(response) == 200
    assert took >= KEEP_ALIVE_S * 0.9


# -- many connections ------------------------------------------------------------------------------------
def test_300_idle_sockets_are_closed_while_normal_requests_are_answered(port):
    socks = [connect(port) for _ in range(300)]
    try:
        for s in socks[::3]:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")   # a third send half their headers
        assert_answers(port)
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 3 * SLACK_S
        for s in socks:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                while s.recv(65536):   # a 408 for the partial ones, then the close
                    pass
            except ConnectionResetError:
                pass
            except socket.timeout:
                raise AssertionError("an idle socket was still open past the header deadline") from None
        assert_answers(port)
    finally:
        for s in socks:
            s.close()


def test_connections_past_the_cap_get_503_and_are_closed():
    limits = ConnectionLimits(max_connections=8, header_timeout_s=HEADER_TIMEOUT_S, keep_alive_s=KEEP_ALIVE_S)
    with running(limits) as p:
        held = [connect(p) for _ in range(8)]
        try:
            time.sleep(0.2)
            with connect(p) as extra:
                response, _ = read_until_closed(extra, 5)
            assert status_of(response) == 503 and "max-connections" in error_of(response)["message"]
            for s in held:   # closed at the header deadline, which frees room for a normal request
                read_until_closed(s, HEADER_TIMEOUT_S + SLACK_S)
            assert_answers(p)
        finally:
            for s in held:
                s.close()


# -- pipelining and HTTP/1.0 ------------------------------------------------------------------------------
def test_pipelined_requests_are_answered_in_order_then_the_idle_connection_closes(port):
    with connect(port) as sock:
        sock.sendall(GET + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + GET)
        response, _ = read_until_closed(sock, KEEP_ALIVE_S + SLACK_S + 2)
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", response)]
    assert statuses == [200, 503, 200]   # /health: 503 while no model is loaded


def test_http_1_0_gets_its_answer_and_the_connection_closes(port):
    with connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
        response, took = read_until_closed(sock, SLACK_S)
    assert status_of(response) == 200 and json.loads(response.split(b"\r\n\r\n", 1)[1])["data"]
    assert took < SLACK_S
