"""Structured output through ``ggflow serve`` and the real ``openai`` client: JSON schemas checked by
``jsonschema``, GBNF, and a tool-call round trip (plain and streamed)."""
from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance (pip install 'ggflow[grammar]')")
jsonschema = pytest.importorskip("jsonschema", reason="the independent schema validator")

from tests.test_serving_http import API_KEY, client, server  # noqa: E402,F401  (the module-scoped server)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_response_format_json_schema_gives_valid_json(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    out = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Name a big city as JSON."}], max_tokens=64,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_a_gbnf_grammar_in_a_completion_request(server):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as h:
        r = h.post("/v1/completions", json={"prompt": "Is the sky blue? Answer:", "max_tokens": 8,
                                            "temperature": 0, "grammar": 'root ::= " yes" | " no"'})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in (" yes", " no")


def test_an_invalid_grammar_or_schema_is_a_400_with_the_reason(server, client):
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as h:
        r = h.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "grammar": 'root ::= "a" ('})
        assert r.status_code == 400 and "GBNF" in r.json()["error"]["message"]
        r = h.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4,
                                                 "response_format": {"type": "yaml"}})
        assert r.status_code == 400 and "response_format" in r.json()["error"]["message"]
        r = h.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "tools": [WEATHER],
                                                 "tool_choice": {"type": "function", "function": {"name": "nope"}}})
        assert r.status_code == 400 and "not among the tools" in r.json()["error"]["message"]


def test_a_required_tool_call_round_trips_through_the_openai_client(client):
    out = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required",
                                         max_tokens=64, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # the tool's answer goes back in; the model answers in text (tool_choice none)
    follow = client.chat.completions.create(
        model="smollm2", max_tokens=24, temperature=0, tools=[WEATHER], tool_choice="none",
        messages=[*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21})}])
    assert follow.choices[0].message.tool_calls is None and follow.choices[0].message.content


def test_streamed_tool_calls_arrive_as_deltas_that_add_up(client):
    stream = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER],
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            max_tokens=64, temperature=0, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        for tc in choice.delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])
