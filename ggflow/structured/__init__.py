"""Structured output: grammars, JSON schemas and tool calls that constrain sampling.

The constraint engine is llguidance (Microsoft's Rust grammar engine, also what llama.cpp builds with
``LLAMA_LLGUIDANCE``): it computes the set of tokens that keep the output inside a grammar in tens of
microseconds over a 50k vocabulary, which a hand-written GBNF interpreter in Python could not. ggflow
brings the pieces around it:

- ``tokenizer``: ggflow's ``Vocab`` (token bytes from the GGUF file) as an llguidance tokenizer, built
  once per vocabulary;
- ``grammar``: what users pass (GBNF as llama.cpp writes it, Lark, a JSON schema, a regex, OpenAI's
  ``response_format``, llama-cpp-python's ``LlamaGrammar``) compiled and checked into one ``Grammar``;
- ``sampler``: the ``GrammarSampler`` that goes first in a sampler chain and masks what the grammar forbids;
- ``tool_calls``: the model family's tool-call syntax, as a grammar and as a parser of the output.
"""
from ggflow.structured.grammar import Grammar, grammar_from_request
from ggflow.structured.sampler import GrammarSampler

__all__ = ["Grammar", "GrammarSampler", "grammar_from_request"]
