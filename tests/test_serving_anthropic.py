"""Anthropic's Messages API on ggflow serve, read by Anthropic's own client (its models and stream parser are
the reference for the shapes); the generated text is checked against /v1/chat/completions on the same
greedy conversation."""
from __future__ import annotations

import httpx
import pytest

from tests.fixtures.default_model import needs_model

anthropic = pytest.importorskip("anthropic", reason="the anthropic client is the reference for the shapes")
pytestmark = needs_model

TIMEOUT_S = 120
GREEDY = {"temperature": 0}   # this client's create() has no temperature argument: it goes in the body
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server():
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=1024, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine)) as url:
        yield url


@pytest.fixture()
def client(server):
    return anthropic.Anthropic(base_url=server, api_key="unused", timeout=TIMEOUT_S, max_retries=0)


@pytest.fixture()
def h(server):
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as c:
        yield c


def _chat(h, messages, max_tokens, **extra):
    r = h.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                             **extra})
    return r.json()["choices"][0]["message"]["content"]


def test_message_text_system_and_usage_as_chat_completions(client, h):
    msg = client.messages.create(model="smollm2", max_tokens=12, extra_body=GREEDY, system="Answer in one word.",
                                 messages=[{"role": "user", "content": "What is the capital of France?"}])
    expected = _chat(h, [{"role": "system", "content": "Answer in one word."},
                         {"role": "user", "content": "What is the capital of France?"}], 12)
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "text" and msg.content[0].text == expected
    assert msg.stop_reason in ("end_turn", "max_tokens") and 0 < msg.usage.output_tokens <= 12
    n = client.messages.count_tokens(model="smollm2", system="Answer in one word.",
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == n.input_tokens


def test_content_blocks_and_stop_sequences(client, h):
    blocks = [{"type": "text", "text": "Count from one"}, {"type": "text", "text": "to ten in words."}]
    full = client.messages.create(model="m", max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": blocks}])
    text = full.content[0].text
    assert text == _chat(h, [{"role": "user", "content": "Count from one\nto ten in words."}], 24)
    word = text.split()[1]
    stopped = client.messages.create(model="m", max_tokens=24, extra_body=GREEDY, stop_sequences=[word],
                                     messages=[{"role": "user", "content": blocks}])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[:text.index(word)]


def test_streamed_events_give_the_same_text(client):
    kwargs = dict(model="m", max_tokens=16, extra_body=GREEDY, messages=[{"role": "user", "content": "Say hello"}])
    plain = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].text == plain.content[0].text and final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_tool_use_forced_and_streamed(client):
    kwargs = dict(model="m", max_tokens=64, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "any"},
                  messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    msg = client.messages.create(**kwargs)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) >= 1
    assert uses[0].name == "get_weather" and isinstance(uses[0].input.get("city"), str)
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in uses]
    # the tool's result goes back in the conversation, and the model answers
    follow = client.messages.create(model="m", max_tokens=8, extra_body=GREEDY, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                           "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21C"}]}])
    assert follow.content and follow.usage.output_tokens > 0


@pytest.mark.parametrize("body, words", [
    ({"max_tokens": 5}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image input is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "name": "x"}]}]}, "tool_use"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [], "system": 3}, "system"),
    ({"messages": [], "tools": [{"input_schema": {}}]}, "tools[0]"),
    ({"messages": [], "tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": [], "max_tokens": "lots"}, "max_tokens"),
    ({"messages": [], "stop_sequences": "x"}, "stop_sequences"),
    ({"messages": [], "thinking": {"type": 1}}, "thinking"),
    ({"messages": [], "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_bad_bodies_are_anthropic_shaped_400s(h, body, words):
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        if route.endswith("count_tokens") and ("max_tokens" in words or "stop_sequences" in words
                                               or "chat_template" in words):
            continue
        r = h.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert words in err["error"]["message"], (route, err)
    assert h.post("/v1/messages", content=b"{not json").json()["type"] == "error"


def test_empty_messages_are_answered(h):
    r = h.post("/v1/messages", json={"messages": [], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["type"] == "message"
