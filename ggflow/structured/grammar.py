"""Grammar: one compiled constraint, whatever form the user wrote it in.

llama.cpp's users write GBNF (``grammar``), llama-server's and OpenAI's write JSON schemas
(``json_schema``, ``response_format``), llama-cpp-python's pass ``LlamaGrammar`` objects. All of them
become llguidance's grammar text here, and are checked against the model's tokenizer before any token
is generated, so a bad grammar is an error that carries llguidance's message (and, for GBNF, the line
and the text around the fault) instead of a failure mid-generation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ggflow.errors import GrammarError
from ggflow.structured.tokenizer import lltokenizer, require_llguidance

if TYPE_CHECKING:
    import llguidance

    from ggflow.core.vocab import Vocab

# Compact JSON with the separators models are trained on; flexible whitespace lets a small model
# wander into endless newlines inside an object.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    text: str      # llguidance's grammar (its JSON form, as LLMatcher.grammar_from_* returns it)
    source: str    # what it was written as: gbnf, lark, regex, json_schema, json_object

    @classmethod
    def from_gbnf(cls, gbnf: str) -> "Grammar":
        """llama.cpp's GBNF (root rule ``root``), converted by llguidance's own ``gbnf_to_lark``."""
        llg = require_llguidance()
        from llguidance.gbnf_to_lark import gbnf_to_lark

        if not isinstance(gbnf, str) or not gbnf.strip():
            raise GrammarError(f"grammar must be a non-empty GBNF string, got {gbnf!r:.80}")
        try:
            lark = gbnf_to_lark(gbnf)
        except Exception as exc:  # noqa: BLE001 - the converter signals some faults with a bare Exception
            raise GrammarError(f"invalid GBNF grammar: {exc}") from None
        return cls(llg.LLMatcher.grammar_from_lark(lark), "gbnf")

    @classmethod
    def from_lark(cls, lark: str) -> "Grammar":
        llg = require_llguidance()
        return cls(llg.LLMatcher.grammar_from_lark(_text(lark, "lark grammar")), "lark")

    @classmethod
    def from_regex(cls, regex: str) -> "Grammar":
        llg = require_llguidance()
        return cls(llg.LLMatcher.grammar_from_regex(_text(regex, "regex")), "regex")

    @classmethod
    def from_json_schema(cls, schema: "Mapping[str, Any] | str") -> "Grammar":
        llg = require_llguidance()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        try:
            text = llg.LLMatcher.grammar_from_json_schema(dict(schema), overrides=_JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"invalid json_schema: {exc}") from None
        return cls(text, "json_schema")

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls(cls.from_json_schema({"type": "object"}).text, "json_object")

    def check(self, vocab: "Vocab") -> None:
        """Raise GrammarError with llguidance's message if the grammar cannot be used with this vocabulary."""
        llg = require_llguidance()
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(self.text, lltokenizer(vocab))
        if failed:
            raise GrammarError(f"invalid {self.source} grammar: {messages[0] if messages else 'rejected'}")

    def matcher(self, vocab: "Vocab") -> "llguidance.LLMatcher":
        """A fresh matcher at the grammar's start (checked first: a bad grammar raises here)."""
        llg = require_llguidance()
        self.check(vocab)
        matcher = llg.LLMatcher(lltokenizer(vocab), self.text, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {self.source} grammar: {matcher.get_error()}")
        return matcher


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise GrammarError(f"{what} must be a non-empty string, got {value!r:.80}")
    return value


def _from_grammar_argument(grammar: Any) -> Grammar:
    if isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, str):
        return Grammar.from_gbnf(grammar)
    gbnf = getattr(grammar, "_grammar", None)   # llama-cpp-python's LlamaGrammar keeps its GBNF text here
    if isinstance(gbnf, str):
        return Grammar.from_gbnf(gbnf)
    raise GrammarError(f"grammar must be a GBNF string, a ggflow Grammar or a LlamaGrammar, "
                       f"got {type(grammar).__name__}")


def _from_response_format(fmt: Any) -> Grammar | None:
    """OpenAI's response_format: text, json_object (llama-server also takes a "schema" there), json_schema."""
    if not isinstance(fmt, Mapping):
        raise GrammarError(f"response_format must be an object like {{\"type\": \"json_object\"}}, got {fmt!r:.80}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema")
        return Grammar.from_json_schema(schema) if schema is not None else Grammar.json_object()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise GrammarError('response_format of type "json_schema" needs "json_schema": '
                               '{"name": ..., "schema": {...}}')
        return Grammar.from_json_schema(spec["schema"])
    raise GrammarError(f"response_format type must be one of text, json_object, json_schema; got {kind!r}")


def grammar_from_request(grammar: Any = None, json_schema: Any = None, response_format: Any = None
                         ) -> Grammar | None:
    """The one constraint a request asks for (llama-server's grammar / json_schema, OpenAI's
    response_format), or None. Asking for two at once is an error, as in llama-server."""
    given = [name for name, value in (("grammar", grammar), ("json_schema", json_schema),
                                       ("response_format", response_format)) if value is not None]
    if len(given) > 1:
        raise GrammarError(f"pass one of grammar, json_schema, response_format, not {' and '.join(given)}")
    if grammar is not None:
        return _from_grammar_argument(grammar)
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema)
    if response_format is not None:
        return _from_response_format(response_format)
    return None
