"""reasoning_format on chat completions: <think>...</think> moved into reasoning_content (whole and streamed as
its own deltas), left in the content with ``none``, dropped with reasoning_budget 0. The model's reply is
forced by a grammar so that it thinks (the default model does not on its own)."""
from __future__ import annotations

import json

import httpx
import pytest

from ggflow.serving.reasoning import ReasoningSplitter, split_reasoning
from tests.fixtures.default_model import needs_model

TIMEOUT_S = 120
THINKING = 'root ::= "<think>" "Paris is in France." "</think>" " The answer is Paris."'
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.parametrize("text, in_think, expected", [
    ("<think>a b</think>c", False, ("a b", "c")),
    ("  <think>\nx</think>\n\ny", False, ("x", "y")),
    ("no thinking here", False, ("", "no thinking here")),
    ("text then <think>not at the start</think>", False, ("", "text then <think>not at the start</think>")),
    ("opened by the prompt</think>answer", True, ("opened by the prompt", "answer")),
    ("<think>never closed", False, ("never closed", "")),
    ("<thin", False, ("", "<thin")),
])
def test_split_whole_and_piece_by_piece_agree(text, in_think, expected):
    assert split_reasoning(text, "auto", in_think) == expected
    s = ReasoningSplitter(True, in_think)
    parts = [s.feed(ch) for ch in text] + [s.finish()]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == expected
    assert split_reasoning(text, "none", in_think) == ("", text)


@pytest.fixture(scope="module")
def server():
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=512, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine)) as url:
        yield url


@pytest.fixture()
def h(server):
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as c:
        yield c


def _chat(h, **extra):
    r = h.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 40, "temperature": 0,
                                             "grammar": THINKING, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


@needs_model
def test_reasoning_content_whole_and_none(h):
    msg = _chat(h)
    assert msg["reasoning_content"] == "Paris is in France." and msg["content"] == " The answer is Paris."
    raw = _chat(h, reasoning_format="none")
    assert raw["content"] == "<think>Paris is in France.</think> The answer is Paris." and "reasoning_content" not in raw
    assert _chat(h, reasoning_format="deepseek") == msg


@needs_model
def test_reasoning_streamed_as_its_own_deltas(h):
    deltas = []
    with h.stream("POST", "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 40, "temperature": 0,
                                                         "grammar": THINKING, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                deltas += [c["delta"] for c in json.loads(line[6:])["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning == "Paris is in France." and content == " The answer is Paris."
    assert not any("reasoning_content" in d and d.get("content") for d in deltas)   # never both in one delta


@needs_model
def test_reasoning_budget_zero_drops_the_thinking(h):
    msg = _chat(h, reasoning_budget=0)
    assert msg["content"] == " The answer is Paris." and "reasoning_content" not in msg


@needs_model
@pytest.mark.parametrize("extra, words", [
    ({"reasoning_format": "loud"}, "reasoning_format"),
    ({"reasoning_budget": 100}, "reasoning_budget"),
    ({"reasoning_budget": "x"}, "reasoning_budget"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
])
def test_bad_reasoning_fields_are_400(h, extra, words):
    r = h.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, **extra})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_server_reasoning_switch_sets_the_template_variable():
    from ggflow.serving.reasoning import ReasoningOptions

    class Body:
        reasoning_format = reasoning_budget = None

    assert ReasoningOptions.for_request(Body(), "auto", "off").template_kwargs({}) == {"enable_thinking": False}
    assert ReasoningOptions.for_request(Body(), "auto", "on").template_kwargs({}) == {"enable_thinking": True}
    assert ReasoningOptions.for_request(Body(), "auto", "auto").template_kwargs({}) == {}
    assert ReasoningOptions.for_request(Body(), "auto", "off").keep is False   # off also drops reasoning
    given = {"enable_thinking": True}   # a request's own kwargs win
    assert ReasoningOptions.for_request(Body(), "auto", "off").template_kwargs(given) == given
