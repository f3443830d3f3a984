"""``ggflow serve --ray``: the prefix hashes and the router's choice (no cluster), then two local replicas
driven through the ``openai`` client (a local Ray on 127.0.0.1, torn down at the end).

The replica tests run ``ggflow serve --ray`` once, then start Ray and two model replicas, n_ctx 512 and 2
slots each, on one thread each (about 40 s in all on 2 cores; GGFLOW_TEST_RAY=0 turns them off); every
request is short (max_tokens <= 8) and every wait is bounded.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from ggflow.serving.ray_router import CHARS_PER_BLOCK, MAX_KEYS, PrefixOwners, prefix_keys

CHAT = "/v1/chat/completions"


def chat_body(messages):
    return json.dumps({"messages": messages, "max_tokens": 4}).encode()


# -- prefix hashes -------------------------------------------------------------------------------------
def test_a_follow_up_turn_repeats_the_keys_of_the_turn_before():
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    k1, k2 = prefix_keys(CHAT, chat_body(turn1)), prefix_keys(CHAT, chat_body(turn2))
    assert len(k1) == 2 and len(k2) == 4
    assert k2[:2] == k1
    other = prefix_keys(CHAT, chat_body([turn1[0], {"role": "user", "content": "Hey"}]))
    assert other[0] == k1[0] and other[1] != k1[1]   # same system prompt, another conversation


def test_completion_prompts_hash_by_blocks():
    text = "x" * (3 * CHARS_PER_BLOCK + 5)
    keys = prefix_keys("/v1/completions", json.dumps({"prompt": text}).encode())
    assert len(keys) == 4
    longer = prefix_keys("/completions", json.dumps({"prompt": [text + "more"]}).encode())
    assert longer[:3] == keys[:3] and longer[3] != keys[3]
    tokens = prefix_keys("/v1/completions", json.dumps({"prompt": list(range(100))}).encode())
    assert len(tokens) == 4
    huge = prefix_keys("/v1/completions", json.dumps({"prompt": "y" * CHARS_PER_BLOCK * (MAX_KEYS + 9)}).encode())
    assert len(huge) == MAX_KEYS


@pytest.mark.parametrize("path, body", [("/v1/models", b""), (CHAT, b"not json"), (CHAT, b"[1, 2]"),
                                        (CHAT, b'{"messages": "hi"}'), ("/v1/completions", b'{"prompt": 3}')])
def test_requests_without_a_prompt_have_no_keys(path, body):
    assert prefix_keys(path, body) == []


def test_prefix_owners_find_the_longest_live_prefix_and_forget_the_oldest():
    owners = PrefixOwners(capacity=3)
    owners.record(["a", "ab"], "r1")
    owners.record(["a"], "r2")
    assert owners.longest(["a", "ab", "abc"], {"r1", "r2"}) == ("r1", 2)
    assert owners.longest(["a", "ab", "abc"], {"r2"}) == ("r2", 1)   # r1 is gone: the shorter prefix's owner
    assert owners.longest(["z"], {"r1", "r2"}) == (None, 0)
    owners.record(["b", "c"], "r2")
    # "ab" was the least recently recorded ("a" was recorded again for r2): it is forgotten
    assert len(owners) == 3 and owners.longest(["a", "ab"], {"r1", "r2"}) == ("r2", 1)


# -- the router's choice, on fake replicas --------------------------------------------------------------
def _router(loads):
    pytest.importorskip("ray.serve.request_router", reason="the router is a Ray Serve RequestRouter")
    from ray.serve._private.request_router.common import ReplicaQueueLengthCache

    from ggflow.serving.ray_router import PrefixAffinityRouter
    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)  # the choice alone, without Serve's plumbing
    router._replica_queue_len_cache = ReplicaQueueLengthCache()
    router.initialize_state(busy_threshold=2)
    replicas = [SimpleNamespace(replica_id=name) for name in loads]
    for name, load in loads.items():
        router._replica_queue_len_cache.update(name, load)
    return router, replicas


def _choose(router, replicas, keys):
    import asyncio
    pending = SimpleNamespace(kwargs={"prefix_keys": keys})
    ranks = asyncio.run(router.choose_replicas(replicas, pending))
    return [[r.replica_id for r in rank] for rank in ranks]


def test_router_prefers_the_prefix_owner_until_it_is_busy():
    router, replicas = _router({"a": 1, "b": 0})
    assert _choose(router, replicas, ["k1"]) == [["b", "a"]]          # unknown prefix: least loaded first
    router.on_request_routed(SimpleNamespace(kwargs={"prefix_keys": ["k1"]}), "a", None)
    assert _choose(router, replicas, ["k1", "k2"]) == [["a"], ["b"]]  # its owner, though more loaded
    router._replica_queue_len_cache.update("a", 2)                    # both of a's slots taken
    assert _choose(router, replicas, ["k1", "k2"]) == [["b", "a"]]
    assert _choose(router, replicas[1:], ["k1"]) == [["b"]]           # a's replica is gone


def test_check_health_raises_once_the_engine_thread_has_died():
    pytest.importorskip("ray.serve", reason="the model replica is a Ray Serve deployment class")
    from ggflow.serving.ray_serve import ModelServer, engine_thread_alive

    thread = threading.Thread(target=lambda: None)
    server = ModelServer.__new__(ModelServer)   # the health logic alone: no model, no replica context
    server.replica, server.engine = "r1", SimpleNamespace(_thread=thread)
    thread.start()
    thread.join()
    assert not engine_thread_alive(server.engine)
    with pytest.raises(RuntimeError, match="engine thread has stopped"):
        server.check_health()
    stop = threading.Event()
    server.engine._thread = threading.Thread(target=stop.wait)
    server.engine._thread.start()
    try:
        server.check_health()   # a running engine is healthy
    finally:
        stop.set()
    server.engine = None        # __del__ of a replica whose model never loaded must not raise


@pytest.mark.parametrize("fields, message", [({"num_replicas": 0}, "--replicas must be at least 1"),
                                             ({"max_replicas": 1, "num_replicas": 2}, "--max-replicas"),
                                             ({"router": "random"}, "unknown router")])
def test_a_bad_deployment_config_is_refused_before_anything_starts(fields, message):
    pytest.importorskip("ray.serve", reason="the deployment is built with Ray Serve")
    from ggflow.errors import GGFlowError
    from ggflow.serving.ray_serve import RayServeConfig, build_app

    with pytest.raises(GGFlowError, match=message):
        build_app(RayServeConfig(model_path="m.gguf", model_name="m", **fields))


def test_the_model_deployment_has_fixed_replicas_or_autoscales_on_ongoing_requests():
    pytest.importorskip("ray.serve", reason="the deployment is built with Ray Serve")
    from ggflow.serving.ray_serve import RayServeConfig, build_app

    def model_deployment(**fields):
        app = build_app(RayServeConfig(model_path="m.gguf", model_name="m", engine={"n_slots": 3}, **fields))
        return app._bound_deployment.init_args[0]._bound_deployment   # the ingress is bound to the model

    fixed = model_deployment(num_replicas=2)
    assert fixed.num_replicas == 2 and fixed.max_ongoing_requests == 6
    assert fixed._deployment_config.request_router_config.request_router_kwargs == {"busy_threshold": 3}
    scaled = model_deployment(num_replicas=1, max_replicas=4, router="pow2")._deployment_config
    assert (scaled.autoscaling_config.min_replicas, scaled.autoscaling_config.max_replicas) == (1, 4)
    assert scaled.autoscaling_config.target_ongoing_requests == 3


# -- two local replicas ---------------------------------------------------------------------------------
RUN_REPLICAS = os.environ.get("GGFLOW_TEST_RAY", "1") != "0"   # about 40 s here: on by default
REQUEST_TIMEOUT_S = 120
RESTART_TIMEOUT_S = 180


@pytest.mark.integration
def test_ggflow_serve_ray_serves_and_exits_0_on_sigterm(tmp_path):
    """The CLI end to end, before the module's cluster starts (one local Ray at a time)."""
    if not RUN_REPLICAS:
        pytest.skip("GGFLOW_TEST_RAY=0: the tests that start a local Ray are off")
    pytest.importorskip("ray.serve", reason="needs Ray Serve: pip install 'ggflow[ray]'")
    import httpx

    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")   # a file, not a pipe: Ray's logging would fill a pipe nobody reads
    proc = subprocess.Popen([sys.executable, "-m", "ggflow.cli", "serve", "--ray", "--replicas", "1", "-np", "1",
                             "-c", "256", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        answer = None
        while answer is None:
            assert time.monotonic() < deadline and proc.poll() is None, "ggflow serve --ray did not come up"
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                               timeout=REQUEST_TIMEOUT_S)
                answer = r if r.status_code == 200 else None
            except httpx.TransportError:
                pass
            time.sleep(0.5 if answer is None else 0)
        assert answer.json()["usage"]["completion_tokens"] >= 1 and answer.headers["x-ggflow-replica"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=RESTART_TIMEOUT_S) == 0, (tmp_path / "serve.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def cluster():
    if not RUN_REPLICAS:
        pytest.skip("GGFLOW_TEST_RAY=0: the tests that start a local Ray and two model replicas are off")
    pytest.importorskip("ray.serve", reason="needs Ray Serve: pip install 'ggflow[ray]'")
    openai = pytest.importorskip("openai", reason="the replica tests drive the server with the openai client")
    from ggflow.api import default_model_path
    from ggflow.serving import ray_serve

    config = ray_serve.RayServeConfig(model_path=default_model_path(), model_name="smollm2",
                                      engine=dict(n_ctx=512, n_slots=2, n_threads=1), num_replicas=2,
                                      health_check_period_s=2)
    try:
        url = ray_serve.start(config, port=_free_port(), num_cpus=2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)
        yield SimpleNamespace(url=url, client=client, serve=ray_serve)
    finally:
        ray_serve.stop()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chat(client, messages, max_tokens=4, stream=False):
    """(text, replica, timings) of one chat completion."""
    raw = client.chat.completions.with_raw_response.create(model="smollm2", messages=messages,
                                                           max_tokens=max_tokens, temperature=0, stream=stream)
    replica = raw.headers.get("x-ggflow-replica")
    if not stream:
        body = raw.http_response.json()
        return body["choices"][0]["message"]["content"], replica, body["timings"]
    text, timings = "", None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        timings = (chunk.model_extra or {}).get("timings", timings)
    return text, replica, timings


@pytest.mark.integration
def test_eight_concurrent_requests_all_succeed_on_both_replicas(cluster):
    def one(i):
        return _chat(cluster.client, [{"role": "user", "content": f"Count to {i + 2}."}], stream=i % 2 == 1)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8), timeout=REQUEST_TIMEOUT_S * 2))
    assert all(text and timings["predicted_n"] >= 1 for text, _, timings in results)
    assert {replica for _, replica, _ in results} == set(_running_replica_ids(cluster)), results


@pytest.mark.integration
def test_a_second_turn_lands_on_its_replica_and_reuses_its_cache(cluster):
    history = [{"role": "system", "content": "You answer in one short sentence."},
               {"role": "user", "content": "What is the capital of France?"}]
    for question in ("What is the capital of France?", "What is the capital of Italy?"):  # 1 in 4 by chance
        history[1]["content"] = question
        text, first, t1 = _chat(cluster.client, history, max_tokens=6)
        turn2 = history + [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Spain?"}]
        _, second, t2 = _chat(cluster.client, turn2, max_tokens=4)
        assert second == first
        assert t2["cached_n"] >= t1["prompt_n"] + t1["cached_n"] - 1 > 0, (t1, t2)


def _running_replica_ids(cluster) -> list[str]:
    """The model replicas' ids, from their actor names (Ray's state API needs the dashboard, which is off)."""
    import ray
    names = ray.util.list_named_actors(all_namespaces=True)
    prefix = f"SERVE_REPLICA::{cluster.serve.APP_NAME}#{cluster.serve.MODEL_DEPLOYMENT}#"
    return [n["name"][len(prefix):] for n in names if n["name"].startswith(prefix)]


@pytest.mark.integration
def test_a_replica_killed_mid_stream_is_restarted_and_later_requests_succeed(cluster):
    import httpx
    import ray
    from ray import serve

    body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True}
    lines = []
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
        victim = r.headers["x-ggflow-replica"]
        stream = r.iter_lines()
        lines.append(next(stream))   # generating: now kill the replica under it
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{cluster.serve.APP_NAME}#{cluster.serve.MODEL_DEPLOYMENT}#{victim}",
                               namespace="serve"), no_restart=True)
        killed = time.monotonic()
        try:
            lines.extend(stream)
        except httpx.HTTPError:   # the connection is cut: what a client of a dead server sees
            pass
    assert "data: [DONE]" not in lines and time.monotonic() - killed < 30   # it ends, unfinished, soon
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while True:
        assert time.monotonic() < deadline, "Serve did not replace the killed replica in time"
        deployment = serve.status().applications[cluster.serve.APP_NAME].deployments[cluster.serve.MODEL_DEPLOYMENT]
        running = deployment.replica_states.get("RUNNING", 0)
        ids = _running_replica_ids(cluster)
        if running == 2 and victim not in ids and len(ids) == 2:
            break
        time.sleep(1)
    served = set()
    for i in range(4):
        text, replica, _ = _chat(cluster.client, [{"role": "user", "content": f"Say {i}."}])
        assert text and replica != victim
        served.add(replica)
    assert served <= set(ids)
