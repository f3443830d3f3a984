"""A full shared KV cache is said, not hidden (issue 45 item 6): a request ended to make room for another says
``evicted`` next to its "length", /metrics counts it; ``slot_share`` gives each slot n_ctx / np, guaranteed.

Two greedy requests whose prompts and replies together need about twice the 64 cells of the cache, run at
once on 2 slots: one of them must be ended early to let the other go on.
"""
from __future__ import annotations

import json
import math
import threading

import httpx
import pytest

from ggflow.api import default_model_path
from ggflow.core.sampling import SamplingParams
from ggflow.generation.request import Done, PromptTooLongError, Request
from ggflow.serving.engine import Engine
from tests.fixtures.default_model import needs_model

pytestmark = needs_model
CELLS = 64
PROMPT_A = "Once upon a time"
PROMPT_B = "The history of the Roman Empire begins with the founding of the city of Rome, which legend dates to"


def greedy_no_end(vocab) -> SamplingParams:
    return SamplingParams(temperature=0.0, logit_bias={t: -math.inf for t in vocab.special.eog})


def run_two(engine: Engine) -> list[tuple[Request, Done]]:
    vocab = engine.vocab
    out: list[tuple[Request, Done]] = []
    requests = [Request(vocab.tokenize(PROMPT_A), lambda e: None, max_tokens=48, sampling=greedy_no_end(vocab)),
                Request(vocab.tokenize(PROMPT_B), lambda e: None, max_tokens=40, sampling=greedy_no_end(vocab))]
    for r in requests:
        r.on_event = (lambda r: lambda e: out.append((r, e)) if isinstance(e, Done) else None)(r)
        engine.submit(r)
    engine.run_until_idle(300)
    return out


@pytest.fixture(scope="module")
def shared():
    engine = Engine.load(default_model_path(), n_ctx=CELLS, n_slots=2, n_threads=1)
    yield engine
    engine.stop(drain=False)


def test_an_evicted_request_says_so_and_is_counted(shared):
    before = shared.metrics.snapshot().n_evicted_total
    done = run_two(shared)
    assert len(done) == 2
    evicted = [(r, d) for r, d in done if r.evicted]
    assert len(evicted) == 1
    r, d = evicted[0]
    assert d.completion.finish_reason == "length" and len(d.completion.tokens) < r.max_tokens
    others = [d for q, d in done if not q.evicted]
    assert others[0].completion.finish_reason == "length"
    assert shared.metrics.snapshot().n_evicted_total == before + 1


def test_slot_share_gives_each_slot_its_part_and_evicts_nobody():
    engine = Engine.load(default_model_path(), n_ctx=CELLS, n_slots=2, n_threads=1, slot_share=True)
    assert engine.n_ctx == CELLS // 2
    done = run_two(engine)
    assert len(done) == 2 and not any(r.evicted for r, _ in done)
    for r, d in done:   # each ends at its own share, with "length" and context_full, not evicted
        assert d.completion.finish_reason == "length" and d.completion.context_full
        assert len(r.prompt) + len(d.completion.tokens) == CELLS // 2 + 1
    assert engine.metrics.snapshot().n_evicted_total == 0
    with pytest.raises(PromptTooLongError) as err:   # refused at submit, before any prefill, with the numbers
        engine.submit(Request(list(range(1, CELLS // 2 + 2)), lambda e: None))
    assert (err.value.n_prompt_tokens, err.value.n_ctx) == (CELLS // 2 + 1, CELLS // 2)


def test_the_server_says_evicted_in_the_response_and_metrics():
    pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
    from ggflow.serving.app import ServerState
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=CELLS, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine)) as url:
        bodies = [{"prompt": PROMPT_A, "max_tokens": 48}, {"prompt": PROMPT_B, "max_tokens": 40, "stream": True}]
        results: list = [None, None]

        def send(i):
            body = {**bodies[i], "temperature": 0, "ignore_eos": True}
            if body.get("stream"):
                with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
                    chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
                results[i] = chunks[-1]["choices"][0]
            else:
                results[i] = httpx.post(url + "/v1/completions", json=body, timeout=300).json()["choices"][0]
        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert all(c is not None and c["finish_reason"] == "length" for c in results), results
        assert sum(bool(c.get("evicted")) for c in results) == 1, results
        metrics = httpx.get(url + "/metrics", timeout=30).text
        assert "llamacpp:requests_evicted_total 1.0" in metrics
