"""Slots always come back (issue 44 item 3): a hypothesis state machine against a live server on 127.0.0.1.

Each step runs a few requests at once, drawn from: plain and streamed greedy completions, n=2 choices, streams
cancelled after some chunks, raw sockets reset before or after the answer starts, embeddings, slot erases,
prompts too long for the context, requests refused at the door (bad grammar, bad token ids) and prompts long
enough that, beside the others, they fill the KV cache. After every step, once every client is done: every
slot of /slots is idle and /metrics reports nothing processing or deferred, within a few seconds. Every
greedy reply equals the reply the server gave to the same request alone, before the machine ran (a reply
cut short by a full cache: a prefix of it); every embedding equals its solo vector up to float32 rounding.

The model is the tiny llama of tests/data (random weights, 512 tokens); 3 slots share 384 cells. Examples,
steps and every request are bounded.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")
pytest.importorskip("hypothesis", reason="the state machine is hypothesis'")
from hypothesis import HealthCheck, settings, strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

from ggflow.serving.app import ServerState  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from tests.test_serving_http import serving  # noqa: E402

MODEL = Path(__file__).parent / "data" / "models" / "tiny-llama-hs-q4_0.gguf"
N_SLOTS, N_CTX = 3, 384
PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = (3, 10)
LONG = " ".join(["river king city machine"] * 12)   # 170 tokens: two of them and a stream fill the cache
EMBED_INPUTS = ["The capital of France is Paris.", " ".join(["story light music"] * 10)]
TIMEOUT_S = 60
IDLE_DEADLINE_S = 15
# an input's cells in the shared cache are wherever the others left room (solo: in order from cell 0), and the
# attention sums over them in cell order: float32 rounding differs (seen: 8e-5 on a unit vector)
EMBED_ATOL = 1e-3


@pytest.fixture(scope="module")
def server():
    if not MODEL.exists():
        pytest.skip(f"{MODEL} is missing")
    engine = Engine.load(str(MODEL), n_ctx=N_CTX, n_slots=N_SLOTS, max_queue=16, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="tiny", engine=engine)) as url:
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as h:
            solo = {(p, n): completion(h, p, n, False)[1] for p in PROMPTS for n in MAX_TOKENS}
            solo.update({(LONG, n): completion(h, LONG, n, False)[1] for n in MAX_TOKENS})
            assert all(solo.values())
            vectors = {text: embed(h, text) for text in EMBED_INPUTS}
        yield url, solo, vectors


def completion(h: httpx.Client, prompt: str, max_tokens: int, stream: bool, n: int = 1) -> tuple[str, str, list]:
    """(status, text of choice 0, [(finish_reason, completion_tokens, text)] of every choice)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "n": n}
    if not stream:
        r = h.post("/v1/completions", json=body)
        if r.status_code != 200:
            return str(r.status_code), "", []
        out = r.json()
        choices = [(c["finish_reason"], None, c["text"]) for c in out["choices"]]
        return "200", choices[0][2], choices
    texts, finish = [], None
    with h.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            return str(r.status_code), "", []
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for c in chunk["choices"]:
                    texts.append(c["text"])
                    finish = c.get("finish_reason") or finish
    return "200", "".join(texts), [(finish, None, "".join(texts))]


def embed(h: httpx.Client, text: str) -> list[float]:
    r = h.post("/v1/embeddings", json={"input": text, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"]


def cancel_stream(h: httpx.Client, prompt: str, after: int) -> None:
    body = {"prompt": prompt, "max_tokens": 60, "temperature": 0, "stream": True}
    with h.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i >= after:
                break   # leaving the block closes the connection mid-stream


def disconnect(url: str, prompt: str, read: int) -> None:
    """Send a streamed request on a raw socket and reset the connection (after reading ``read`` bytes)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": prompt, "max_tokens": 60, "temperature": 0, "stream": True}).encode()
    s = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if read:
            s.recv(read)
    finally:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


ACTIONS = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from(PROMPTS), st.sampled_from(MAX_TOKENS)),
    st.tuples(st.just("stream"), st.sampled_from(PROMPTS), st.sampled_from(MAX_TOKENS)),
    st.tuples(st.just("n2"), st.sampled_from(PROMPTS), st.sampled_from(MAX_TOKENS)),
    st.tuples(st.just("cancel"), st.sampled_from(PROMPTS), st.integers(0, 4)),
    st.tuples(st.just("disconnect"), st.sampled_from(PROMPTS), st.sampled_from([0, 1, 200])),
    st.tuples(st.just("embed"), st.sampled_from(EMBED_INPUTS), st.just(0)),
    st.tuples(st.just("erase"), st.just(""), st.integers(0, N_SLOTS - 1)),
    st.tuples(st.just("long"), st.just(LONG), st.sampled_from(MAX_TOKENS)),
    st.tuples(st.just("too_long"), st.just(" ".join(["word"] * 600)), st.just(4)),
    st.tuples(st.just("refused"), st.sampled_from(["grammar", "token", "bias"]), st.just(4)),
    st.tuples(st.just("grammar"), st.sampled_from(PROMPTS), st.sampled_from(MAX_TOKENS)),
)
GRAMMAR = 'root ::= [a-z ]+ "."'   # a valid grammar: its replies end in "." or are cut at max_tokens


class SlotsMachine(RuleBasedStateMachine):
    url, solo, vectors = "", {}, {}

    @rule(actions=st.lists(ACTIONS, min_size=1, max_size=4))
    def run_at_once(self, actions):
        with ThreadPoolExecutor(len(actions)) as pool:
            for f in [pool.submit(self.do, *a) for a in actions]:
                f.result()

    @rule(slot=st.integers(0, N_SLOTS - 1))
    def erase(self, slot):
        self.do("erase", "", slot)

    def do(self, kind: str, prompt: str, arg: int) -> None:
        with httpx.Client(base_url=self.url, timeout=TIMEOUT_S) as h:
            if kind in ("plain", "stream", "n2", "long"):
                status, _, choices = completion(h, prompt, arg, kind == "stream", 2 if kind == "n2" else 1)
                assert status == "200", (kind, status)
                want = self.solo[(prompt, arg)]
                for finish, _, text in choices:
                    if kind == "long" and finish == "length" and text != want:
                        assert want.startswith(text), (prompt, arg, text, want)   # cut short by a full cache
                    else:
                        assert text == want, (kind, prompt, arg, text, want)
            elif kind == "grammar":
                r = h.post("/v1/completions", json={"prompt": prompt, "max_tokens": arg, "temperature": 0,
                                                    "grammar": GRAMMAR})
                assert r.status_code == 200, r.text
                text = r.json()["choices"][0]["text"]
                assert set(text) <= set("abcdefghijklmnopqrstuvwxyz ."), text
            elif kind == "cancel":
                cancel_stream(h, prompt, arg)
            elif kind == "disconnect":
                disconnect(self.url, prompt, arg)
            elif kind == "embed":
                np.testing.assert_allclose(embed(h, prompt), self.vectors[prompt], rtol=0, atol=EMBED_ATOL)
            elif kind == "erase":
                r = h.post(f"/slots/{arg}", params={"action": "erase"})
                assert r.status_code in (200, 400), r.text   # 400: the slot is processing
            elif kind == "too_long":
                r = h.post("/v1/completions", json={"prompt": prompt, "max_tokens": arg})
                assert r.status_code == 400, r.text
            elif kind == "refused":
                body = {"prompt": "Hi", "max_tokens": arg,
                        **{"grammar": {"grammar": "root ::= ("}, "token": {"prompt": [1, 2, 10**6]},
                           "bias": {"logit_bias": {"999999": 1}}}[prompt]}
                r = h.post("/v1/completions", json=body)
                assert r.status_code == 400, (prompt, r.status_code, r.text)

    @invariant()
    def every_slot_is_idle(self):
        if not self.url:
            return
        deadline = time.monotonic() + IDLE_DEADLINE_S
        with httpx.Client(base_url=self.url, timeout=TIMEOUT_S) as h:
            while True:
                slots = h.get("/slots").json()
                metrics = {line.split()[0]: float(line.split()[1]) for line in h.get("/metrics").text.splitlines()
                           if line.startswith("llamacpp:requests_")}
                busy = [s["id"] for s in slots if s["is_processing"]]
                if not busy and metrics["llamacpp:requests_processing"] == 0 \
                        and metrics["llamacpp:requests_deferred"] == 0:
                    return
                assert time.monotonic() < deadline, f"slots {busy} still busy; {metrics}"
                time.sleep(0.1)


def test_slots_come_back_idle_after_any_mix_of_requests(server):
    SlotsMachine.url, SlotsMachine.solo, SlotsMachine.vectors = server
    run = SlotsMachine.TestCase
    run.settings = settings(max_examples=int(os.environ.get("SLOTS_EXAMPLES", 6)), stateful_step_count=5,
                            deadline=None, database=None, derandomize=True,
                            suppress_health_check=list(HealthCheck))
    run().runTest()
