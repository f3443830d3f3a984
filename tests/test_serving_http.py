"""``ggflow serve`` through the real ``openai`` client: a server on 127.0.0.1 at a free port, the default model.

Every request loop here is bounded in count and time, and the server is always shut down.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the HTTP tests drive the server with the openai client")
pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
pytest.importorskip("prometheus_client", reason="/metrics renders through prometheus-client (the server extra)")
uvicorn = pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ggflow.api import default_model_path  # noqa: E402
from ggflow.serving.app import ServerState, create_app  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from ggflow.serving.http_protocol import uvicorn_config  # noqa: E402
from ggflow.serving.limits import ConnectionLimits  # noqa: E402

API_KEY = "test-key"
TIMEOUT_S = 120
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Three primary colors are"]


SERVED: dict = {}   # the fixture's engine, for tests that build a second app on its Context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(state: ServerState, connection_limits: ConnectionLimits | None = None, modes=None):
    """uvicorn on 127.0.0.1 at a free port in a thread, serving ``state``'s engine (in ``ggflow serve``'s
    ``modes`` when given: --embedding / --reranking); stopped (engine too) after."""
    port = free_port()
    app = create_app(state)
    if modes is not None:
        app.state.ggflow_modes = modes
    srv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, connection_limits, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)
        state.engine.stop(drain=False, timeout=30)


@pytest.fixture(scope="module")
def server():
    engine = Engine.load(default_model_path(), n_ctx=1024, n_slots=4, n_threads=1)
    engine.start()
    SERVED["engine"] = engine
    with serving(ServerState(model_name="smollm2", api_key=API_KEY, engine=engine)) as url:
        yield url


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, timeout=TIMEOUT_S, max_retries=0)


def http(server):
    return httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=TIMEOUT_S)


def wait_idle(server, timeout=30.0) -> list:
    with http(server) as h:
        deadline = time.monotonic() + timeout
        while True:
            slots = h.get("/slots").json()
            if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
                return slots
            time.sleep(0.1)


def erase_all(server) -> None:
    """llama-server's slot erase on every slot: the next requests start from an empty cache."""
    with http(server) as h:
        for slot in wait_idle(server):
            assert h.post(f"/slots/{slot['id']}", params={"action": "erase"}).status_code == 200


def complete(client, prompt, max_tokens=16) -> str:
    return client.completions.create(model="smollm2", prompt=prompt, max_tokens=max_tokens,
                                     temperature=0).choices[0].text


def stream_completion(client, prompt, max_tokens=16) -> str:
    stream = client.completions.create(model="smollm2", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True)
    return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


# -- completions and chat ----------------------------------------------------------------------------
def test_completion_has_text_usage_and_timings(client):
    r = client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert "Paris" in r.choices[0].text
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    timings = r.model_extra["timings"]
    assert timings["predicted_n"] == 8 and timings["prompt_n"] + timings["cached_n"] == r.usage.prompt_tokens


def test_streamed_completion_equals_the_plain_one_and_reports_usage(client):
    plain = complete(client, PROMPTS[1], 12)
    stream = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_completion_plain_and_streamed_as_llm_gives_it(client):
    from ggflow.api import LLM

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    expected = LLM(n_ctx=256, n_threads=1).create_chat_completion(messages, max_tokens=20, temperature=0)
    r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=20, temperature=0)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert text == expected["choices"][0]["message"]["content"] and text
    assert r.usage.prompt_tokens == expected["usage"]["prompt_tokens"]
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=20, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_four_concurrent_greedy_streams_each_get_their_text_alone(server, client):
    """From an empty cache both times (see test_serving_engine for prefix reuse under concurrency)."""
    alone = []
    for p in PROMPTS:
        erase_all(server)
        alone.append(stream_completion(client, p, 24))
    erase_all(server)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: stream_completion(client, p, 24), PROMPTS))
    assert together == alone
    with http(server) as h:
        metrics = {m.name: m for m in text_string_to_metric_families(h.get("/metrics").text)}
    assert metrics["llamacpp:n_busy_slots_per_decode"].samples[0].value > 1


def test_a_client_cancelled_mid_stream_frees_its_slot(server, client):
    wait_idle(server)
    stream = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=400, temperature=0,
                                       stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    with http(server) as h:
        assert any(s["is_processing"] for s in h.get("/slots").json())
    stream.close()
    slots = wait_idle(server, timeout=30)
    assert not any(s["is_processing"] for s in slots)
    assert all(s["n_cached"] < 200 for s in slots)   # it stopped long before its 400 tokens


# -- errors ------------------------------------------------------------------------------------------
def test_missing_or_wrong_api_key_is_401_but_health_is_open(server):
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as h:
        r = h.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = h.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert h.get("/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize("body", [b"{not json", b'{"prompt": "x", "max_tokens": "ten"}', b'{"prompt": 3}',
                                  b'{"prompt": "x", "temperature": "hot"}', b'[1, 2]',
                                  b'{"prompt": "x", "logit_bias": {"99999999": 1.0}}', b'{"prompt": "x", "n": 0}'])
def test_malformed_or_mistyped_body_is_400(server, body):
    with http(server) as h:
        r = h.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"]


def test_prompt_longer_than_the_context_is_400_with_both_counts(server, client):
    with http(server) as h:
        r = h.post("/v1/completions", json={"prompt": list(range(10, 1200)), "max_tokens": 1})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (1190, 1024)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt="word " * 1100, max_tokens=1)


def test_health_is_503_while_the_model_loads():
    from fastapi.testclient import TestClient

    with TestClient(create_app(ServerState(model_name="loading"))) as h:
        r = h.get("/health")
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        assert h.post("/v1/completions", json={"prompt": "x"}).status_code == 503


def test_queue_full_is_503(server):
    """A second, never started engine on the same Context: one request fills its only slot, no queue."""
    from fastapi.testclient import TestClient
    from ggflow.serving import Request

    engine = Engine(SERVED["engine"].ctx, n_slots=1, max_queue=0)
    engine.submit(Request([1, 2, 3], lambda ev: None))
    with TestClient(create_app(ServerState(model_name="m", engine=engine))) as h:
        r = h.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"


def test_a_client_that_leaves_a_plain_request_frees_its_slot(server):
    wait_idle(server)
    # the client leaves after 1 s and the handler notices within DISCONNECT_POLL_S more: a request of 900
    # tokens is still under way then (one thread decodes 100-200 tok/s), and must stop well short of its end
    body = {"prompt": PROMPTS[1], "max_tokens": 900, "temperature": 0}
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.0) as h:
        with pytest.raises(httpx.ReadTimeout):
            h.post("/v1/completions", json=body)
    slots = wait_idle(server, timeout=30)
    assert not any(s["is_processing"] for s in slots)
    assert all(s["n_cached"] < body["max_tokens"] // 2 for s in slots)


# -- the other routes --------------------------------------------------------------------------------
def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]


def test_slot_erase_forgets_the_cached_tokens(server, client):
    complete(client, PROMPTS[0], 4)
    erase_all(server)
    with http(server) as h:
        assert all(s["n_cached"] == 0 for s in h.get("/slots").json())
        assert h.post("/slots/99", params={"action": "erase"}).status_code == 400


def test_props_report_the_slots_and_context(server):
    with http(server) as h:
        props = h.get("/props").json()
    assert (props["total_slots"], props["n_ctx"]) == (4, 1024)
    assert props["default_generation_settings"]["temperature"] == 0.8 and props["chat_template"]


def test_tokenize_and_detokenize_round_trip(server):
    with http(server) as h:
        tokens = h.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert tokens and all(isinstance(t, int) for t in tokens)
        assert h.post("/detokenize", json={"tokens": tokens}).json()["content"] == "Hello world"


def test_metrics_parse_as_prometheus_text_with_llama_server_names(server, client):
    complete(client, PROMPTS[0], 4)
    with http(server) as h:
        r = h.get("/metrics")
    assert r.status_code == 200
    families = {m.name: m for m in text_string_to_metric_families(r.text)}
    for name in ("llamacpp:prompt_tokens", "llamacpp:tokens_predicted", "llamacpp:prompt_seconds",
                 "llamacpp:tokens_predicted_seconds", "llamacpp:n_decode"):
        assert families[name].type == "counter"
    for name in ("llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:kv_cache_usage_ratio"):
        assert families[name].type == "gauge"
    assert families["llamacpp:tokens_predicted"].samples[0].value >= 4
    assert 0 < families["llamacpp:kv_cache_usage_ratio"].samples[0].value <= 1


# -- the command -------------------------------------------------------------------------------------
def test_serve_command_finishes_in_flight_requests_on_sigterm_and_exits_0(tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ggflow.cli", "serve", "--port", str(port), "-np", "2",
                             "-c", "512", "-t", "1"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "GGFLOW_API_KEY": ""})
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + TIMEOUT_S
        with httpx.Client(base_url=base, timeout=TIMEOUT_S) as h:
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                try:
                    if h.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.25)
            lines = []
            body = {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "stream": True}
            with h.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line)
                    if len(lines) == 2:
                        proc.send_signal(signal.SIGTERM)
        assert lines[-1] == "data: [DONE]"
        finish = json.loads(lines[-2][5:])["choices"][0]["finish_reason"]
        assert finish == "length"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def test_serve_is_a_ggflow_command_with_llama_server_flags(capsys):
    from ggflow.cli import main

    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "-np", "-c", "--api-key", "--backend", "-t"):
        assert flag in out
    assert main(["serve", "-np", "0"]) == 2 and "-np/--parallel: 0 is out of range" in capsys.readouterr().err


def test_seeded_streams_sample_the_same_alone_and_concurrently(server, client):
    """Each request has its own sampler chain and RNG: a seed gives the same text whatever runs beside it."""
    def sample(prompt):
        return client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=1.0,
                                         seed=77).choices[0].text
    erase_all(server)
    alone = sample(PROMPTS[1])
    erase_all(server)
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(sample, [PROMPTS[0], PROMPTS[1], PROMPTS[2]]))
    assert together[1] == alone


def test_stop_string_ends_the_completion_before_it(client):
    free = complete(client, PROMPTS[2], 24)
    stop = free[free.index("\n", 1):][:3]
    r = client.completions.create(model="smollm2", prompt=PROMPTS[2], max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[:free.index(stop)]
