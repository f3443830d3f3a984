"""The server and ``LLM`` run one generation loop (ggflow.generation): the server answers what ``LLM`` does.

Chat logprobs from a ``ggflow serve`` process, read with the openai client, equal ``LLM.create_chat_completion``'s
for the same greedy request (within 1e-4: the same float32 log-softmax of logits that the batch-invariant CPU
kernels make the same whether the request was decoded alone or beside others); ``n`` choices, ``echo``, and
a context that fills up with ``--context-shift`` on and off.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from ggflow.api import LLM, default_model_path  # noqa: E402

TIMEOUT_S = 300
LOGPROB_TOL = 1e-4
MESSAGES = [{"role": "user", "content": "Name three colors."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(tmp_path, *flags: str):
    """``ggflow serve`` on 127.0.0.1 at a free port; (process, base url, log file) once /health says ok."""
    port = free_port()
    log = open(tmp_path / f"serve-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ggflow.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "-t", "1", *flags], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "GGFLOW_API_KEY": ""})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + TIMEOUT_S
    with httpx.Client(base_url=base, timeout=10) as h:
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / f"serve-{port}.log").read_text()
            try:
                if h.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
    return proc, base, log


def stop_serve(proc, log) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, base, log = start_serve(tmp_path_factory.mktemp("serve"), "-np", "4", "-c", "1024")
    try:
        yield base
    finally:
        stop_serve(proc, log)


@pytest.fixture(scope="module")
def llm():
    return LLM(default_model_path(), n_ctx=1024, n_threads=1)


def test_chat_logprobs_from_the_server_equal_the_llms(served, llm):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
    got = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0,
                                         logprobs=True, top_logprobs=3)
    want = llm.create_chat_completion(MESSAGES, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    served_items, local_items = got.choices[0].logprobs.content, want["choices"][0]["logprobs"]["content"]
    assert len(served_items) == len(local_items) > 0
    for s, w in zip(served_items, local_items):
        assert s.token == w["token"] and s.bytes == w["bytes"]
        assert abs(s.logprob - w["logprob"]) <= LOGPROB_TOL
        assert [t.token for t in s.top_logprobs] == [t["token"] for t in w["top_logprobs"]]
        assert all(abs(a.logprob - b["logprob"]) <= LOGPROB_TOL for a, b in zip(s.top_logprobs, w["top_logprobs"]))


def test_n_3_returns_three_choices_from_one_prompt(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
    got = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=7, n=3)
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert all(c.message.content for c in got.choices)
    greedy = client.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0,
                                       n=3)
    assert len(greedy.choices) == 3 and len({c.text for c in greedy.choices}) == 1   # greedy: the same text
    assert greedy.usage.completion_tokens == sum(8 for _ in greedy.choices)


def test_completion_echo_and_logprobs_match_the_llms(served, llm):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
    prompt = "The capital of France is"
    got = client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0, echo=True, logprobs=2)
    want = llm.create_completion(prompt, max_tokens=6, temperature=0, echo=True, logprobs=2)
    assert got.choices[0].text == want["choices"][0]["text"] and got.choices[0].text.startswith(prompt)
    g, w = got.choices[0].logprobs, want["choices"][0]["logprobs"]
    assert g.tokens == w["tokens"] and g.token_logprobs[0] is None and w["token_logprobs"][0] is None
    assert all(abs(a - b) <= LOGPROB_TOL for a, b in zip(g.token_logprobs[1:], w["token_logprobs"][1:]))
    plain = client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0, echo=False)
    assert got.choices[0].text == prompt + plain.choices[0].text


def test_a_full_context_ends_with_length_unless_the_server_shifts_it(tmp_path):
    body = {"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0, "ignore_eos": True}
    for flags, finish, n_out in (((), "length", None), (("--context-shift", "--keep", "4"), "length", 150)):
        proc, base, log = start_serve(tmp_path, "-np", "1", "-c", "64", *flags)
        try:
            with httpx.Client(base_url=base, timeout=TIMEOUT_S) as h:
                r = h.post("/v1/completions", json=body)
        finally:
            stop_serve(proc, log)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["choices"][0]["finish_reason"] == finish
        n_prompt, n_done = out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"]
        if n_out is None:   # off: the sequence's 64 cells end it (the last sampled token needs no cell)
            assert n_done == 64 - n_prompt + 1
        else:               # on: it went on past the context, to max_tokens
            assert n_done == n_out


def test_n_choices_share_the_prompts_cells_and_greedy_ones_agree_with_llm(llm):
    from ggflow.core.context import Context
    from ggflow.core.sampling import SamplingParams
    from ggflow.generation.engine import Engine
    from ggflow.generation.request import Done, Request

    engine = Engine(Context(llm.model, n_ctx=512, n_threads=1), n_slots=4)
    prompt = llm.tokenize(b"Once upon a time, in a small village by the sea,")
    done: list[Done] = []

    def sink(event):
        if isinstance(event, Done):
            done.append(event)
    greedy = SamplingParams(temperature=0)
    requests = [Request(prompt, sink, max_tokens=6, sampling=greedy) for _ in range(3)]
    requests[0].siblings = requests[1:]
    engine.submit(requests[0])
    engine.step()   # the prompt is evaluated once, and the two other slots take its cells
    cells = engine.ctx.memory.n_used
    assert sum(s.is_busy for s in engine.slots) == 3 and cells < 2 * len(prompt)
    engine.run_until_idle(TIMEOUT_S)
    alone = llm.generate(prompt, max_tokens=6, temperature=0)
    assert len(done) == 3 and all(d.error is None and d.completion.tokens == alone.tokens for d in done)
    assert [d.completion.timings.cached_n for d in done].count(len(prompt)) == 2   # the siblings evaluated none


def test_streamed_chat_logprobs_add_up_to_the_whole_answers(served):
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
    whole = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0,
                                           logprobs=True, top_logprobs=2)
    streamed = []
    for part in client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, temperature=0,
                                               logprobs=True, top_logprobs=2, stream=True):
        if part.choices and part.choices[0].logprobs is not None:
            streamed.extend(part.choices[0].logprobs.content)
    want = whole.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in want]
    assert all(abs(a.logprob - b.logprob) <= LOGPROB_TOL for a, b in zip(streamed, want))


def test_a_streamed_echo_starts_with_the_prompt(served):
    with httpx.Client(base_url=served, timeout=TIMEOUT_S) as h:
        body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "echo": True}
        whole = h.post("/v1/completions", json=body).json()["choices"][0]["text"]
        with h.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    texts = [json.loads(x)["choices"][0]["text"] for x in lines[:-1]]
    assert texts[0] == body["prompt"] and "".join(texts) == whole


def test_n_above_the_slots_or_streamed_is_a_400(served):
    with httpx.Client(base_url=served, timeout=TIMEOUT_S) as h:
        too_many = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "n": 5})
        streamed = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "n": 2, "stream": True})
    assert too_many.status_code == 400 and "n=5" in too_many.json()["error"]["message"]
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]
