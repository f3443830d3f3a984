"""Constrained generation on the default model, checked by references that are not llguidance:
``jsonschema`` for JSON schemas, ``json`` for JSON grammars, regexes written here for the GBNF samples,
and llama.cpp's own grammar files (grammars/*.gbnf, from the llama-cpp-python sdist that CI fetches)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance (pip install 'ggflow[grammar]')")
jsonschema = pytest.importorskip("jsonschema", reason="the independent schema validator")

from ggflow.api import LLM
from ggflow.errors import GrammarError
from ggflow.structured import Grammar, GrammarSampler
from tests.fixtures.default_model import MISSING

# llama.cpp's grammars: .ci/run unpacks them from the llama-cpp-python sdist (never committed here)
GRAMMARS = Path(os.environ.get("GGFLOW_LLAMACPP_GRAMMARS",
                               Path.home() / ".cache" / "ggflow-test" / "llama.cpp-grammars"))


@pytest.fixture(scope="module")
def llm():
    if MISSING:
        pytest.skip(MISSING)
    return LLM(n_ctx=1024, backend="cpu", seed=7)


def _ask(llm, prompt, max_tokens=96, **kw):
    out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                     temperature=0, **kw)
    return out["choices"][0]


# Twenty schemas; strings, integers and arrays are bounded so that a 135M model finishes within max_tokens.
NAME = {"type": "string", "minLength": 1, "maxLength": 12}
INT = {"type": "integer", "minimum": -1000, "maximum": 1000}   # greedy digits of a free integer never stop
SCHEMAS = {
    "integer": INT,
    "number_enum": {"enum": [1.5, 2.5, 10]},   # a free JSON number's digits are unbounded: a 135M model runs on
    "boolean_object": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                       "additionalProperties": False},
    "person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0,
                                                                       "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "enum_color": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                   "required": ["color"], "additionalProperties": False},
    "const": {"type": "object", "properties": {"kind": {"const": "point"}, "x": INT},
              "required": ["kind", "x"], "additionalProperties": False},
    "array_min_max": {"type": "array", "items": INT, "minItems": 2, "maxItems": 4},
    "array_of_names": {"type": "object", "properties": {"names": {"type": "array", "items": NAME,
                                                                   "minItems": 1, "maxItems": 3}},
                       "required": ["names"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": NAME, "address": {"type": "object", "properties": {"city": NAME, "zip": {
            "type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"],
            "additionalProperties": False}}, "required": ["name", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "pattern_date": {"type": "object", "properties": {"date": {"type": "string",
                                                                "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
                     "required": ["date"], "additionalProperties": False},
    "pattern_code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
    "ref": {"$defs": {"pt": {"type": "object", "properties": {"x": INT, "y": INT},
                             "required": ["x", "y"], "additionalProperties": False}},
            "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
            "required": ["a", "b"], "additionalProperties": False},
    "any_of": {"anyOf": [INT, {"type": "object", "properties": {"error": NAME},
                                                "required": ["error"], "additionalProperties": False}]},
    "one_of_types": {"type": "object", "properties": {"v": {"type": ["integer", "boolean"], "minimum": 0,
                                                                          "maximum": 9}}, "required": ["v"],
                     "additionalProperties": False},
    "optional_props": {"type": "object", "properties": {"title": NAME, "year": INT},
                       "required": ["title"], "additionalProperties": False},
    "integer_bounds": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20}},
                       "required": ["n"], "additionalProperties": False},
    "exclusive_bounds": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    "array_of_objects": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
        "type": "object", "properties": {"id": INT, "tag": {"enum": ["a", "b"]}},
        "required": ["id", "tag"], "additionalProperties": False}},
    "string_length": {"type": "object", "properties": {"word": {"type": "string", "minLength": 3,
                                                                 "maxLength": 6}},
                      "required": ["word"], "additionalProperties": False},
    "tuple_prefix_items": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 8},
                                                            INT], "items": False},
}
assert len(SCHEMAS) == 20


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_output_validates_with_jsonschema(llm, name):
    schema = SCHEMAS[name]
    choice = _ask(llm, f"Reply with JSON for: {name.replace('_', ' ')}.",
                  response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_json_object_mode_gives_a_json_object(llm):
    choice = _ask(llm, "Describe a cat as JSON.", max_tokens=160, response_format={"type": "json_object"})
    text = choice["message"]["content"]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # ran out of tokens: what was produced still starts an object
        assert text.startswith("{")


def test_a_grammar_cut_short_by_max_tokens_ends_with_length_and_a_valid_prefix(llm):
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    out = llm.create_completion("A long story:", max_tokens=8, temperature=0, json_schema=schema)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    sampler = GrammarSampler(Grammar.from_json_schema(schema), llm.vocab)
    for tid in llm.vocab.tokenize(choice["text"], add_special=False):   # the text is a prefix the grammar allows
        sampler.accept(tid)
    assert not sampler.is_accepting


def test_an_invalid_grammar_fails_before_any_token(llm):
    with pytest.raises(GrammarError, match="GBNF"):
        llm.create_completion("x", max_tokens=4, grammar='root ::= "a" (')
    with pytest.raises(GrammarError):
        llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=4,
                                   response_format={"type": "json_schema", "json_schema": {"name": "x"}})


# llama.cpp's grammars with an independent check of what a complete output looks like
GBNF_CHECKS = {
    "json.gbnf": lambda s: isinstance(json.loads(s), dict),
    "json_arr.gbnf": lambda s: isinstance(json.loads(s), list),
    "list.gbnf": lambda s: re.fullmatch(r"(- [^\n]+\n)+", s) is not None,
    "arithmetic.gbnf": lambda s: re.fullmatch(r"[0-9+\-*/() \n]+", s) is not None,
    "chess.gbnf": lambda s: s.startswith("1. "),
    "japanese.gbnf": lambda s: len(s) > 0,
    "c.gbnf": lambda s: len(s) > 0,
}


@pytest.mark.parametrize("name", sorted(GBNF_CHECKS))
def test_llama_cpp_grammars_constrain_generation(llm, name):
    path = GRAMMARS / name
    if not path.exists():
        pytest.skip(f"{path} is missing: .ci/run unpacks llama.cpp's grammars from the llama-cpp-python sdist")
    gbnf = path.read_text()
    out = llm.create_completion("Here is an example:\n", max_tokens=48, temperature=0, grammar=gbnf)
    choice = out["choices"][0]
    tokens = llm.tokenize(choice["text"], add_special=False)
    sampler = GrammarSampler(Grammar.from_gbnf(gbnf), llm.vocab)
    for tid in tokens:                   # every token the model produced continues the grammar
        sampler.accept(tid)
    if choice["finish_reason"] == "stop":
        assert sampler.is_accepting
        assert GBNF_CHECKS[name](choice["text"]), choice["text"]
