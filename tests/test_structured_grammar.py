"""Grammars: compiling what users write (GBNF, Lark, regex, JSON schema, response_format) and masking with it.

The reference for "allowed" is independent of llguidance where one exists: Python's json module for JSON,
the ``re`` module for regexes; for the mask itself, every token it allows must extend the text to
something the grammar's own matcher still accepts, and the tokens it forbids must not.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance (pip install 'ggflow[grammar]')")

from ggflow.api import default_model_path
from ggflow.core.sampling import TokenDataArray
from ggflow.core.vocab import Vocab
from ggflow.errors import GrammarError
from ggflow.structured import Grammar, GrammarSampler, grammar_from_request
from ggflow.structured.tokenizer import lltokenizer


@pytest.fixture(scope="module")
def vocab():
    try:
        return Vocab.from_file(default_model_path())
    except Exception as exc:  # noqa: BLE001 - the reason goes into the skip
        pytest.skip(f"the default model is not installed: {exc}")


def test_the_llguidance_tokenizer_is_built_once_per_vocab_and_sees_every_token(vocab):
    tok = lltokenizer(vocab)
    assert lltokenizer(vocab) is tok
    assert tok.vocab_size == vocab.n_vocab
    text = "Hello, world! {\"a\": 1}"
    assert tok.decode_str(vocab.tokenize(text, add_special=False)) == text
    assert tok.is_special_token(vocab.eos_id)


def test_invalid_gbnf_is_an_error_that_names_the_place():
    with pytest.raises(GrammarError, match="line 2"):
        Grammar.from_gbnf('root ::= "a" item\nitem ::= "b" @ "c"\n')


def test_gbnf_with_an_undefined_rule_is_refused_before_generation(vocab):
    with pytest.raises(GrammarError, match="nothere"):
        Grammar.from_gbnf('root ::= "a" nothere').check(vocab)


def test_invalid_regex_and_schema_are_errors(vocab):
    with pytest.raises(GrammarError):
        Grammar.from_regex("a(b").check(vocab)
    with pytest.raises(GrammarError, match="not valid JSON"):
        Grammar.from_json_schema("{not json")
    with pytest.raises(GrammarError, match="JSON object"):
        Grammar.from_json_schema([1, 2])
    with pytest.raises(GrammarError):
        Grammar.from_json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}).check(vocab)


def test_a_request_may_name_only_one_constraint():
    assert grammar_from_request() is None
    assert grammar_from_request(response_format={"type": "text"}) is None
    assert grammar_from_request(response_format={"type": "json_object"}).source == "json_object"
    g = grammar_from_request(response_format={"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"type": "integer"}}})
    assert g.source == "json_schema"
    with pytest.raises(GrammarError, match="grammar and json_schema"):
        grammar_from_request(grammar='root ::= "a"', json_schema={"type": "integer"})
    with pytest.raises(GrammarError, match="json_object, json_schema"):
        grammar_from_request(response_format={"type": "yaml"})
    with pytest.raises(GrammarError, match="needs"):
        grammar_from_request(response_format={"type": "json_schema"})


def test_llama_cpp_python_grammar_objects_are_accepted():
    class LlamaGrammar:  # llama-cpp-python's class keeps its GBNF text in _grammar
        _grammar = 'root ::= "yes" | "no"'
    assert grammar_from_request(grammar=LlamaGrammar()).source == "gbnf"
    with pytest.raises(GrammarError, match="GBNF string"):
        grammar_from_request(grammar=42)


def _pieces(vocab, ids):
    return [vocab.token_to_piece(int(i)) for i in ids]


def test_the_mask_allows_exactly_the_tokens_that_keep_a_regex_matchable(vocab):
    """Every allowed token extends "" to a prefix of some string of [0-9]{3}; a sample of the forbidden don't."""
    sampler = GrammarSampler(Grammar.from_regex(r"[0-9]{3}"), vocab)
    allowed = sampler.allowed()
    ids = np.flatnonzero(allowed)
    assert len(ids) > 0
    prefix = re.compile(r"^[0-9]{0,3}$")
    for piece in _pieces(vocab, ids):
        assert prefix.match(piece.decode("utf-8", "replace")), piece
    normal = [i for i in range(vocab.n_vocab) if not vocab.is_eog(i)]
    digits_only = [i for i in normal if re.fullmatch(rb"[0-9]{1,3}", vocab.token_to_piece(i))]
    assert set(digits_only) <= set(ids.tolist())


def test_masked_tokens_get_minus_infinity_and_sampling_follows_the_grammar(vocab):
    sampler = GrammarSampler(Grammar.from_gbnf('root ::= "yes" | "no"'), vocab)
    logits = np.random.default_rng(0).normal(size=vocab.n_vocab).astype(np.float32)
    cur = TokenDataArray.from_logits(logits)
    sampler.apply(cur)
    live = np.flatnonzero(np.isfinite(cur.logits))
    assert {vocab.token_to_piece(int(i)) for i in live} <= {b"y", b"ye", b"yes", b"n", b"no"}
    assert np.array_equal(cur.logits[live], logits[live])


def test_accept_advances_the_grammar_until_only_end_of_generation_remains(vocab):
    sampler = GrammarSampler(Grammar.from_gbnf('root ::= "yes"'), vocab)
    for tid in vocab.tokenize("yes", add_special=False):
        sampler.accept(tid)
    assert sampler.is_complete
    allowed = np.flatnonzero(sampler.allowed())
    assert allowed.size and all(vocab.is_eog(int(i)) for i in allowed)


def test_a_token_outside_the_grammar_is_refused_and_clones_are_independent(vocab):
    sampler = GrammarSampler(Grammar.from_gbnf('root ::= "yes" | "no"'), vocab)
    twin = sampler.clone()
    with pytest.raises(GrammarError):
        sampler.accept(vocab.tokenize("maybe", add_special=False)[0])
    twin.accept(vocab.tokenize("no", add_special=False)[0])   # the clone did not inherit the failure
    assert twin.is_accepting


def test_json_schema_grammar_accepts_valid_json_token_by_token(vocab):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    sampler = GrammarSampler(Grammar.from_json_schema(schema), vocab)
    text = json.dumps({"n": 42})
    for tid in vocab.tokenize(text, add_special=False):
        assert sampler.allowed()[tid], vocab.token_to_piece(tid)
        sampler.accept(tid)
    assert sampler.is_accepting
