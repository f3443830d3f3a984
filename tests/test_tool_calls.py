"""Tool-call formats: recognised from real chat templates, parsed from replies, enforced by grammars."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="tool calls need llguidance (pip install 'ggflow[grammar]')")

from ggflow.api import default_model_path
from ggflow.core.vocab import Vocab
from ggflow.errors import GrammarError
from ggflow.structured.sampler import GrammarSampler
from ggflow.structured.tool_calls import (GenericFormat, HermesFormat, Llama3JsonFormat, ToolCallStream, ToolSpec,
                                          detect_format)
from tests.data_dir import DATA

TEMPLATES = DATA / "chat-templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def vocab():
    try:
        return Vocab.from_file(default_model_path())
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"the default model is not installed: {exc}")


@pytest.mark.parametrize("name, expected", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3_json"),
    ("google-gemma-2-2b-it.jinja", "generic"),
    ("Qwen3-Coder.jinja", "generic"),          # <tool_call> with XML-style arguments: not Hermes JSON
])
def test_the_format_is_recognised_from_the_template(name, expected):
    assert detect_format((TEMPLATES / name).read_text()).name == expected


def test_tool_specs_are_checked():
    assert ToolSpec.parse(None) is None
    spec = ToolSpec.parse([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert spec.choice == "required" and list(spec.callable()) == ["get_time"]
    with pytest.raises(GrammarError, match="not among the tools"):
        ToolSpec.parse([WEATHER], {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(GrammarError, match=r"tools\[0\]"):
        ToolSpec.parse([{"type": "function", "function": {}}])
    with pytest.raises(GrammarError, match="tool_choice"):
        ToolSpec.parse([WEATHER], "sometimes")
    with pytest.raises(GrammarError, match="needs tools"):
        ToolSpec.parse(None, "required")


def test_hermes_replies_parse_into_calls_and_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = HermesFormat().parse(text)
    assert content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris", "unit": "C"}),
                                                      ("get_time", {})]
    assert json.loads(calls[0].as_openai()["function"]["arguments"]) == {"city": "Paris", "unit": "C"}
    assert HermesFormat().parse("no calls here") == ("no calls here", [])


def test_llama3_and_generic_replies_parse():
    _, calls = Llama3JsonFormat().parse('<|python_tag|>{"name": "get_time", "parameters": {}}')
    assert [c.name for c in calls] == ["get_time"]
    content, calls = GenericFormat().parse('{"response": "It is sunny."}')
    assert (content, calls) == ("It is sunny.", [])
    _, calls = GenericFormat().parse('{"tool_calls": [{"name": "get_time", "arguments": {}}]}')
    assert [c.name for c in calls] == ["get_time"]


def test_streaming_holds_back_what_may_become_a_tool_call():
    stream = ToolCallStream(HermesFormat())
    sent = "".join(stream.feed(p) for p in ["Sure", ", one moment.", "\n<tool", "_call>\n", '{"name": "get_time", ',
                                             '"arguments": {}}\n</tool_call>'])
    assert sent == "Sure, one moment.\n"
    rest, calls = stream.finish()
    assert rest == "" and [c.name for c in calls] == ["get_time"]
    plain = ToolCallStream(HermesFormat())
    assert plain.feed("a <tool") == "a "      # "<tool" may still become "<tool_call>"
    assert plain.feed(" box>") == "<tool box>"
    assert plain.finish() == ("", [])


@pytest.mark.parametrize("fmt", [HermesFormat(), Llama3JsonFormat(), GenericFormat()], ids=lambda f: f.name)
def test_required_tool_grammars_accept_a_well_formed_call_and_refuse_a_wrong_name(fmt, vocab):
    spec = ToolSpec.parse([WEATHER, TIME], "required")
    args = {"city": "Paris", "unit": "C"}
    if fmt.name == "hermes":
        good = '<tool_call>\n' + json.dumps({"name": "get_weather", "arguments": args}) + '\n</tool_call>'
    elif fmt.name == "llama3_json":
        good = json.dumps({"name": "get_weather", "parameters": args})
    else:
        good = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": args}]})
    sampler = GrammarSampler(fmt.grammar(spec), vocab)
    for tid in vocab.tokenize(good, add_special=False):
        sampler.accept(tid)
    assert sampler.is_accepting
    _, calls = fmt.parse(good)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", args)]
    bad = good.replace("get_weather", "get_wheather")
    sampler = GrammarSampler(fmt.grammar(spec), vocab)
    with pytest.raises(GrammarError):
        for tid in vocab.tokenize(bad, add_special=False):
            sampler.accept(tid)


def test_auto_leaves_hermes_and_llama3_free_but_keeps_generic_json(vocab):
    spec = ToolSpec.parse([WEATHER], "auto")
    assert HermesFormat().grammar(spec) is None and Llama3JsonFormat().grammar(spec) is None
    sampler = GrammarSampler(GenericFormat().grammar(spec), vocab)
    for tid in vocab.tokenize('{"response": "Hi"}', add_special=False):
        sampler.accept(tid)
    assert sampler.is_accepting


# -- through LLM.create_chat_completion on the default model -------------------------------------------
@pytest.fixture(scope="module")
def llm():
    from ggflow.api import LLM
    try:
        return LLM(n_ctx=1024, backend="cpu")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"the default model is not installed: {exc}")


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_llm_chat_returns_a_required_tool_call_in_openai_shape(llm):
    import jsonschema

    out = llm.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


def test_llm_chat_streams_the_tool_call_as_one_delta(llm):
    chunks = list(llm.create_chat_completion(ASK, tools=[WEATHER, TIME], stream=True, max_tokens=64,
                                             temperature=0, tool_choice={"type": "function",
                                                                         "function": {"name": "get_time"}}))
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [tc["function"]["name"] for tc in calls] == ["get_time"] and calls[0]["index"] == 0
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)   # JSON held back, not streamed


def test_tools_and_a_grammar_together_are_refused(llm):
    from ggflow.errors import ArgumentError
    with pytest.raises(ArgumentError, match="tools"):
        llm.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required", max_tokens=4,
                                   response_format={"type": "json_object"})
