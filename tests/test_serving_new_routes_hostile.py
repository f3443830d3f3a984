"""Hostile and malformed bodies on the routes of llama_routes / anthropic / responses_api / slot files: every
one is a 4xx with an error body of the route's shape, never a 5xx or a traceback; the server answers a good
request afterwards. Bodies: not JSON, not objects, deep nesting, and each known field replaced by values of
every JSON type (a fixed, bounded set)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.default_model import needs_model

pytestmark = needs_model

TIMEOUT_S = 60
ODD_VALUES = [None, True, -1, 2 ** 40, 1e300, "x", "", [], [None], [[1, "a"]], {}, {"a": {"b": []}}]
ROUTES = {  # route -> (a good body, the error shape: "openai" or "anthropic")
    "/completion": ({"prompt": "Hi", "n_predict": 1}, "openai"),
    "/infill": ({"input_prefix": "a", "input_suffix": "b", "n_predict": 1}, "openai"),
    "/apply-template": ({"messages": [{"role": "user", "content": "Hi"}]}, "openai"),
    "/props": ({}, "openai"),
    "/tokenize": ({"content": "Hi", "with_pieces": True}, "openai"),
    "/v1/messages": ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}, "anthropic"),
    "/v1/messages/count_tokens": ({"messages": [{"role": "user", "content": "Hi"}]}, "anthropic"),
    "/v1/responses": ({"input": "Hi", "max_output_tokens": 1}, "openai"),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                              "reasoning_format": "auto", "chat_template_kwargs": {}}, "openai"),
    "/slots/0?action=save": ({"filename": "ok.bin"}, "openai"),
    "/slots/0?action=restore": ({"filename": "ok.bin"}, "openai"),
}
EXTRA_FIELDS = {"/completion": ["n_probs", "response_fields", "id_slot", "post_sampling_probs", "return_tokens",
                                "multimodal_data", "stop", "stream", "logit_bias", "ignore_eos"],
                "/infill": ["input_extra", "prompt", "input_prefix"],
                "/apply-template": ["tools", "chat_template_kwargs", "add_generation_prompt"],
                "/v1/messages": ["system", "stop_sequences", "tools", "tool_choice", "thinking", "metadata",
                                 "stream", "top_k"],
                "/v1/responses": ["instructions", "tools", "tool_choice", "previous_response_id", "stream"],
                "/v1/chat/completions": ["reasoning_budget", "messages"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=256, n_slots=1, n_threads=1)
    engine.start()
    folder = tmp_path_factory.mktemp("slots")
    with serving(ServerState(model_name="smollm2", engine=engine, slot_save_path=str(folder))) as url:
        yield url


def _bodies(route: str, good: dict):
    yield from (b"", b"null", b"[]", b'"text"', b"{", b'{"a": NaN}', b"\xff\xfe", b"[" * 5000 + b"]" * 5000)
    yield json.dumps({"x": 1}).encode()
    for name in [*good, *EXTRA_FIELDS.get(route, [])]:
        for value in ODD_VALUES:
            yield json.dumps({**good, name: value}).encode()


def _check_shape(r: httpx.Response, shape: str, route: str, body: bytes) -> None:
    infill_refused = route == "/infill" and r.status_code == 501   # the default model has no FIM tokens
    assert r.status_code < 500 or infill_refused, (route, body[:200], r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()
        if shape == "anthropic":
            assert err["type"] == "error" and isinstance(err["error"]["message"], str), (route, err)
        else:
            assert isinstance(err["error"]["message"], str), (route, err)


@pytest.mark.parametrize("route", list(ROUTES))
def test_no_body_gets_a_5xx(server, route):
    good, shape = ROUTES[route]
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as h:
        for body in _bodies(route, good):
            if b'"stream": true' in body or b'"stream": [' in body:
                continue   # a stream's status is sent before generation: covered by the plain request
            r = h.post(route, content=body, headers={"content-type": "application/json"})
            _check_shape(r, shape, route, body)
        if not route.startswith("/slots") and route != "/infill":
            assert h.post(route, json=good).status_code == 200
