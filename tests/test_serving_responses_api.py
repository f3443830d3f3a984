"""OpenAI's Responses API (stateless) on ggflow serve, read by the openai client (its Response model and
stream event types are the reference for the shapes); the text is checked against /v1/chat/completions."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.fixtures.default_model import needs_model

pytestmark = needs_model

TIMEOUT_S = 120
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a primary colour."}]
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


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
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=TIMEOUT_S, max_retries=0)


@pytest.fixture()
def h(server):
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as c:
        yield c


def _chat(h, messages, max_tokens):
    r = h.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    return r.json()["choices"][0]["message"]["content"]


def test_response_text_ids_and_usage(client, h):
    res = client.responses.create(model="m", input=MESSAGES, max_output_tokens=10, temperature=0)
    assert res.id.startswith("resp_") and res.output[0].id.startswith("msg_")
    assert res.output_text == _chat(h, MESSAGES, 10)
    assert res.usage.output_tokens <= 10 and res.usage.input_tokens > 0
    assert res.status in ("completed", "incomplete")
    same = client.responses.create(model="m", instructions="Answer briefly.", input="Name a primary colour.",
                                   max_output_tokens=10, temperature=0)
    assert same.output_text == res.output_text   # instructions + a string input is the same conversation


def test_streamed_events_add_up_to_the_response(client):
    plain = client.responses.create(model="m", input=MESSAGES, max_output_tokens=10, temperature=0)
    kinds, text, completed = [], "", None
    for ev in client.responses.create(model="m", input=MESSAGES, max_output_tokens=10, temperature=0, stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            completed = ev.response
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
            "response.output_item.done"} <= set(kinds)
    assert text == completed.output_text == plain.output_text


def test_function_call_and_its_output(client):
    res = client.responses.create(model="m", input="What is the weather in Paris?", tools=[WEATHER],
                                  tool_choice="required", max_output_tokens=64, temperature=0)
    calls = [o for o in res.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and '"city"' in calls[0].arguments
    follow = client.responses.create(model="m", tools=[WEATHER], max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny"}])
    assert follow.usage.output_tokens > 0


@pytest.mark.parametrize("body, words", [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "not supported"),
    ({"input": [{"type": "web_search_call"}]}, "not supported"),
    ({"input": "x", "previous_response_id": "resp_1"}, "stateless"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "x", "chat_template_kwargs": {"tools": 1}}, "chat_template_kwargs"),
])
def test_bad_bodies_are_openai_shaped_400s(h, body, words):
    r = h.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and words in r.json()["error"]["message"]
