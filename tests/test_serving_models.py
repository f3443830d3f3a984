"""Many models behind one server (ggflow/serving/model_pool.py, model_router.py, model_config.py): a request's
model picks the engine, loading it on first use; at most --models-max loaded, the least recently used idle one
unloaded first; /models/load and /models/unload; --sleep-idle-seconds. Each model's answers are checked
against ``LLM`` on the same file (what a one-model server is tested to give)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
import openai  # noqa: E402
import uvicorn  # noqa: E402

from ggflow.api import LLM  # noqa: E402
from ggflow.serving.app import create_app  # noqa: E402
from ggflow.serving.http_protocol import uvicorn_config  # noqa: E402
from ggflow.serving.model_config import ModelConfigError, ModelSpec, specs_from_config, specs_from_dir  # noqa: E402
from ggflow.serving.model_pool import ModelPool, ModelsBusyError, UnknownModelError  # noqa: E402
from ggflow.serving.model_router import RouterState, install_router  # noqa: E402
from tests.data_dir import DATA  # noqa: E402
from tests.test_serving_http import free_port  # noqa: E402

MODELS = {"llama": "tiny-llama-hs-q8_0.gguf", "qwen": "tiny-qwen2-hs-q8_0.gguf", "gpt2": "tiny-gpt2-hs-q8_0.gguf"}
ENGINE = dict(n_ctx=256, n_slots=2, n_threads=1)
PROMPT = "Once upon a time"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    for name, file in MODELS.items():
        os.symlink(DATA / "models" / file, folder / f"{name}.gguf")
    return folder


@pytest.fixture(scope="module")
def reference():
    """Each model's greedy completion of PROMPT, from LLM on its file."""
    out = {}
    for name, file in MODELS.items():
        llm = LLM(str(DATA / "models" / file), n_ctx=256, n_threads=1)
        out[name] = llm.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    return out


@contextlib.contextmanager
def serve_pool(pool: ModelPool, api_key: str | None = None):
    """The router app on 127.0.0.1 at a free port in a thread; every engine stopped after."""
    state = RouterState(model_name=pool.names[0], api_key=api_key)
    app = create_app(state)
    install_router(app, state, pool)
    port = free_port()
    srv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, None, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    pool.start_sleeper()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)
        pool.close()


@pytest.fixture()
def router(models_dir):
    pool = ModelPool(specs_from_dir(str(models_dir)), max_loaded=2, defaults=ENGINE)
    with serve_pool(pool) as url:
        yield url


def status(h: httpx.Client) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in h.get("/v1/models").json()["data"]}


def complete(h: httpx.Client, model: str | None, **extra) -> httpx.Response:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    return h.post("/v1/completions", json=body)


# -- which models: a folder, a config file ----------------------------------------------------------------------
def test_models_dir_names_files_by_stem_and_split_models_once(tmp_path):
    for name in ("a.gguf", "b-Q4_K_M-00001-of-00002.gguf", "b-Q4_K_M-00002-of-00002.gguf", "mmproj-a.gguf",
                 "notes.txt"):
        (tmp_path / name).write_bytes(b"GGUF")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "c-F16.gguf").write_bytes(b"GGUF")
    (tmp_path / "c" / "mmproj-F16.gguf").write_bytes(b"GGUF")
    specs = {s.name: os.path.basename(s.path) for s in specs_from_dir(str(tmp_path))}
    assert specs == {"a": "a.gguf", "b-Q4_K_M": "b-Q4_K_M-00001-of-00002.gguf", "c": "c-F16.gguf"}


def test_models_dir_without_models_is_refused(tmp_path):
    with pytest.raises(ModelConfigError, match="holds no GGUF model files"):
        specs_from_dir(str(tmp_path))
    with pytest.raises(ModelConfigError, match="is not a folder"):
        specs_from_dir(str(tmp_path / "missing"))


def test_config_in_toml_and_json_gives_each_model_its_options(tmp_path):
    (tmp_path / "m.toml").write_text('[defaults]\nctx-size = 512\n\n[models.small]\nmodel = "s.gguf"\n'
                                     'parallel = 2\nload-on-startup = true\n\n[models.hub]\nhf = "me/x-GGUF:Q8_0"\n'
                                     "ctx_size = 1024\n")
    toml_specs = {s.name: s for s in specs_from_config(str(tmp_path / "m.toml"))}
    assert toml_specs["small"].path == str(tmp_path / "s.gguf") and toml_specs["small"].load_on_startup
    assert toml_specs["small"].options == {"n_ctx": 512, "n_slots": 2}
    assert toml_specs["hub"].hf == "me/x-GGUF:Q8_0" and toml_specs["hub"].options == {"n_ctx": 1024}
    (tmp_path / "m.json").write_text(json.dumps({"models": {"small": {"model": "/abs/s.gguf", "threads": 1}}}))
    (spec,) = specs_from_config(str(tmp_path / "m.json"))
    assert spec.path == "/abs/s.gguf" and spec.options == {"n_threads": 1}


@pytest.mark.parametrize("text, message", [
    ('[models.a]\nmodel = "a.gguf"\nctx = 5\n', r"unknown option models\.a\.ctx; accepted: backend"),
    ('[models.a]\nparallel = 2\n', "needs exactly one of model"),
    ('[models.a]\nmodel = "a.gguf"\nparallel = "2"\n', "must be an integer"),
    ('[models.a]\nmodel = "a.gguf"\nparallel = 0\n', "out of range"),
    ('[models.a]\nmodel = "a.gguf"\ncontext-shift = 1\n', "must be a boolean"),
    ("[models]\n", "names no models"),
    ("models = [", "is not valid TOML"),
    ('[model.a]\nmodel = "a.gguf"\n', "names no models"),
])
def test_bad_config_is_refused_naming_what_is_wrong(tmp_path, text, message):
    (tmp_path / "m.toml").write_text(text)
    with pytest.raises(ModelConfigError, match=message):
        specs_from_config(str(tmp_path / "m.toml"))


# -- the pool: least recently used idle model unloaded first -----------------------------------------------------
class FakeEngine:
    def __init__(self, path):
        self.path, self.running = path, False

    def start(self):
        self.running = True

    def stop(self, drain=True, timeout=None):
        self.running = False


def fake_pool(max_loaded: int, sleep_idle_s=None) -> ModelPool:
    specs = [ModelSpec(n, f"/models/{n}.gguf") for n in "abc"]
    return ModelPool(specs, max_loaded=max_loaded, sleep_idle_s=sleep_idle_s,
                     loader=lambda path, options: FakeEngine(path))


def test_lru_unloads_the_least_recently_used_idle_model():
    pool = fake_pool(2)

    async def scenario():
        for name in ("a", "b", "a"):          # b is now the least recently used
            pool.release(await pool.acquire(name))
        pool.release(await pool.acquire("c"))
    asyncio.run(scenario())
    assert {n: e.status for n, e in pool.models.items()} == {"a": "loaded", "b": "unloaded", "c": "loaded"}


def test_a_model_with_requests_in_flight_is_never_unloaded():
    pool = fake_pool(2)

    async def scenario():
        held = await pool.acquire("a")        # a: the oldest, but busy
        pool.release(await pool.acquire("b"))
        pool.release(await pool.acquire("c"))
        assert pool.models["a"].engine.running and pool.models["b"].engine is None
        pool.release(held)
    asyncio.run(scenario())


def test_all_loaded_models_busy_is_a_clear_refusal():
    pool = fake_pool(1)

    async def scenario():
        await pool.acquire("a")
        with pytest.raises(ModelsBusyError, match="--models-max 1"):
            await pool.acquire("b")
    asyncio.run(scenario())


def test_unknown_model_lists_the_names():
    with pytest.raises(UnknownModelError, match="model 'z' not found; this server serves: a, b, c"):
        fake_pool(1).get("z")


def test_idle_models_sleep_and_wake():
    pool = fake_pool(3, sleep_idle_s=0.1)
    pool.start_sleeper()
    try:
        asyncio.run(pool.load("a"))
        engine = pool.models["a"].engine
        deadline = time.monotonic() + 10
        while pool.models["a"].status != "sleeping":
            assert time.monotonic() < deadline, "the model did not go to sleep"
            time.sleep(0.05)
        assert not engine.running
        entry = asyncio.run(pool.acquire("a"))
        assert entry.status == "loaded" and entry.engine.running
        time.sleep(0.4)
        assert entry.status == "loaded", "a model in use went to sleep"
        pool.release(entry)
    finally:
        pool.close()


def test_an_unloaded_model_is_freed():
    """Unloading drops the engine, its context (KV cache) and the weights: nothing keeps them alive."""
    import gc
    import weakref

    spec = ModelSpec("gpt2", str(DATA / "models" / MODELS["gpt2"]))
    pool = ModelPool([spec], defaults=ENGINE)
    asyncio.run(pool.load("gpt2"))
    engine = pool.models["gpt2"].engine
    refs = [weakref.ref(engine), weakref.ref(engine.ctx), weakref.ref(engine.ctx.model)]
    del engine
    assert asyncio.run(pool.unload("gpt2"))
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    pool.close()


# -- over HTTP ------------------------------------------------------------------------------------------------
def test_v1_models_lists_every_model_with_its_status(router):
    with httpx.Client(base_url=router, timeout=TIMEOUT_S) as h:
        data = h.get("/v1/models").json()["data"]
        assert [m["id"] for m in data] == ["gpt2", "llama", "qwen"]
        assert {m["status"]["value"] for m in data} == {"unloaded"}
        assert h.get("/").status_code == 200 and h.get("/static/chat.js").status_code == 200
        assert set(status(h).values()) == {"unloaded"}, "the chat page loaded a model"
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["gpt2", "llama", "qwen"]


def test_requests_model_picks_the_engine_loading_it_on_first_use(router, reference):
    with httpx.Client(base_url=router, timeout=TIMEOUT_S) as h:
        for name in ("llama", "qwen"):
            r = complete(h, name)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == name
            assert r.json()["choices"][0]["text"] == reference[name]
        assert status(h) == {"gpt2": "unloaded", "llama": "loaded", "qwen": "loaded"}
        complete(h, "llama")                  # qwen is now the least recently used
        r = h.post("/v1/chat/completions", json={"model": "gpt2", "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code in (200, 400), r.text   # loaded either way (tiny gpt2 may have no chat template)
        assert status(h) == {"gpt2": "loaded", "llama": "loaded", "qwen": "unloaded"}


def test_streaming_from_a_picked_model(router, reference):
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)
    stream = client.completions.create(model="qwen", prompt=PROMPT, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == reference["qwen"]


def test_unknown_model_is_an_openai_404_listing_the_names(router):
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    error = info.value.body
    assert error["type"] == "not_found_error" and "gpt2, llama, qwen" in error["message"]


def test_a_request_naming_no_model_is_a_400_when_there_are_several(router):
    with httpx.Client(base_url=router, timeout=TIMEOUT_S) as h:
        r = complete(h, None)
        assert r.status_code == 400 and "names no model" in r.json()["error"]["message"]


def test_load_and_unload_routes(router):
    with httpx.Client(base_url=router, timeout=TIMEOUT_S) as h:
        assert h.post("/models/load", json={"model": "gpt2"}).json() == {"success": True}
        assert status(h)["gpt2"] == "loaded"
        assert h.get("/props", params={"model": "gpt2"}).json()["n_ctx"] == 256
        assert h.post("/models/unload", json={"model": "gpt2"}).json() == {"success": True}
        assert status(h)["gpt2"] == "unloaded"
        again = h.post("/models/unload", json={"model": "gpt2"})
        assert again.status_code == 400 and "not loaded" in again.json()["error"]["message"]
        assert h.get("/props").json()["role"] == "router"


@pytest.mark.parametrize("body, code", [({"model": 5}, 400), ({}, 400), ([1], 400), ({"model": "nope"}, 404)])
def test_load_route_refuses_bad_bodies(router, body, code):
    with httpx.Client(base_url=router, timeout=TIMEOUT_S) as h:
        for route in ("/models/load", "/models/unload"):
            r = h.post(route, json=body)
            assert r.status_code == code, r.text
            assert set(r.json()["error"]) >= {"message", "type", "code"}


def test_hostile_bodies_get_4xx_before_any_model_loads(router):
    with httpx.Client(base_url=router, timeout=TIMEOUT_S) as h:
        def chunked():   # no Content-Length: the limit is met while the body is read
            for _ in range(40):
                yield b" " * 65536
        r = h.post("/v1/completions", content=chunked())
        assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
        r = complete(h, "x" * 100000)
        assert r.status_code == 404 and len(r.json()["error"]["message"]) < 300
        for body in (b"{not json", b"[]", b'{"model": 5, "prompt": "a"}', b'{"model": "llama", "prompt": 5}'):
            r = h.post("/v1/completions", content=body)
            assert r.status_code == 400, (body, r.text)
        assert h.get("/props", params={"model": "nope"}).status_code == 404
        assert h.post("/v1/no-such-route", json={"model": "llama"}).status_code == 404
        assert h.get("/v1/completions", params={"model": "llama"}).status_code == 405
        assert status(h)["gpt2"] == "unloaded"
        assert h.post("/v1/no-such-route", json={"model": "gpt2"}).status_code == 404
        assert status(h)["gpt2"] == "unloaded", "a request no route takes loaded a model"


def test_a_model_that_fails_to_load_is_a_503_naming_it(tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    pool = ModelPool(specs_from_dir(str(tmp_path)), defaults=ENGINE)
    with serve_pool(pool) as url, httpx.Client(base_url=url, timeout=TIMEOUT_S) as h:
        r = complete(h, "broken")
        assert r.status_code == 503 and "model 'broken' failed to load" in r.json()["error"]["message"]
        assert h.get("/v1/models").json()["data"][0]["status"]["failed"] is True


def test_sleeping_server_answers_read_only_routes_and_wakes_on_a_request(reference):
    """llama-server's test_sleep: /health, /props, /models answer while asleep and do not wake the model."""
    spec = ModelSpec("llama", str(DATA / "models" / MODELS["llama"]))
    pool = ModelPool([spec], max_loaded=1, sleep_idle_s=0.5, defaults=ENGINE, single=True)
    with serve_pool(pool, api_key="k") as url, httpx.Client(base_url=url, timeout=TIMEOUT_S,
                                                            headers={"Authorization": "Bearer k"}) as h:
        assert complete(h, "whatever-name").json()["choices"][0]["text"] == reference["llama"]
        deadline = time.monotonic() + 20
        while not h.get("/props").json()["is_sleeping"]:
            assert time.monotonic() < deadline, "the server did not go to sleep"
            time.sleep(0.1)
        assert h.get("/health").status_code == 200
        assert [m["id"] for m in h.get("/v1/models").json()["data"]] == ["llama"]
        assert h.get("/metrics").status_code == 503    # no engine to report on while asleep
        assert h.get("/props").json()["is_sleeping"], "a read-only route woke the model"
        assert complete(h, None).json()["choices"][0]["text"] == reference["llama"]
        assert h.get("/props").json()["is_sleeping"] is False
        assert httpx.get(f"{url}/v1/models").status_code == 401   # the router's routes keep the API key


# -- ggflow serve --models-dir / --models-config ---------------------------------------------------------------
def serve_cli(*argv: str):
    import subprocess
    import sys

    port = free_port()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "ggflow.cli", "serve", "--port", str(port), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(proc, h: httpx.Client) -> None:
    def up():
        try:
            return h.get("/health").status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, proc.communicate()[1].decode()
            return False
    deadline = time.monotonic() + 60
    while not up():
        assert time.monotonic() < deadline, "ggflow serve did not start"
        time.sleep(0.2)


def test_serve_models_dir_from_the_command_line(models_dir, reference):
    import signal

    proc, url = serve_cli("--models-dir", str(models_dir), "--models-max", "1", "-c", "256", "-np", "1", "-t", "1")
    try:
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as h:
            wait_up(proc, h)
            assert sorted(status(h)) == ["gpt2", "llama", "qwen"]
            assert complete(h, "qwen").json()["choices"][0]["text"] == reference["qwen"]
            assert complete(h, "llama").json()["choices"][0]["text"] == reference["llama"]
            assert status(h) == {"gpt2": "unloaded", "llama": "loaded", "qwen": "unloaded"}   # --models-max 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


def test_serve_one_model_that_sleeps_from_the_command_line(reference):
    """-m with --sleep-idle-seconds: loaded at start, asleep when idle, woken by the next request."""
    import signal

    proc, url = serve_cli("-m", str(DATA / "models" / MODELS["llama"]), "--alias", "tiny", "--sleep-idle-seconds",
                          "1", "-c", "256", "-np", "1", "-t", "1")
    try:
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as h:
            wait_up(proc, h)
            deadline = time.monotonic() + 60
            seen = set()
            while "sleeping" not in seen:       # loaded at start, then asleep after a second of no use
                seen.add(status(h)["tiny"])
                assert time.monotonic() < deadline, f"no sleep; statuses seen: {seen}"
                time.sleep(0.05)
            assert "loaded" in seen or "loading" in seen
            assert h.get("/props").json()["is_sleeping"] is True
            assert complete(h, "any-name").json()["choices"][0]["text"] == reference["llama"]
            assert h.get("/props").json()["is_sleeping"] is False
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize("argv, message", [
    (["--models-dir", "D", "--models-config", "F"], "--models-dir and --models-config both name the models"),
    (["--models-dir", "D", "-m", "x.gguf"], "-m/-hf name one model"),
    (["--models-config", "/nonexistent/m.toml"], "No such file"),
    (["--models-max", "0", "--models-dir", "D"], "--models-max: 0 is out of range"),
    (["--sleep-idle-seconds", "-1"], "--sleep-idle-seconds: -1 is out of range"),
    (["--models-dir", "D", "--ray"], "--ray serves one model"),
])
def test_serve_models_usage_errors_are_one_line(models_dir, argv, message):
    argv = [str(models_dir) if a == "D" else a for a in argv]
    proc, _ = serve_cli(*argv)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err.decode()
    assert message in err.decode()
