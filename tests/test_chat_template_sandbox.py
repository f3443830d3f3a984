"""A chat template is code from the model file: it renders in a sandbox with a budget.

Escapes through attributes (``__class__``, ``__globals__``, name-mangled internals, str.format fields)
are refused by jinja2's sandbox; loops, recursion and growth that would never end, or end with
gigabytes, are refused by the budget (ggflow/core/template_sandbox.py). Every refusal is a
ChatTemplateError, never a hang, a raw exception or a leak.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from ggflow.core.chat_template import ChatTemplate
from ggflow.core.template_sandbox import TemplateBudget
from ggflow.errors import ChatTemplateError

HI = [{"role": "user", "content": "hi"}]

RUNAWAY = {
    "nested_loops": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "loop_over_a_long_string": "{% set s = 'x' * 5000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "exponential_macro": "{% macro d(n) %}{% if n %}{{ d(n-1) }}{{ d(n-1) }}{% endif %}{% endmacro %}{{ d(60) }}",
    "doubling_with_tilde": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                           "{% endfor %}{{ ns.s }}",
    "doubling_with_plus": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                          "{% endfor %}{{ ns.s }}",
    "string_times_huge": "{{ 'x' * 10**10 }}",
    "list_times_huge": "{% for m in messages * 10**9 %}{% endfor %}",
    "squaring_an_int": "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}"
                       "{% endfor %}{{ ns.x }}",
    "huge_power": "{{ 7 ** 99999999 }}",
    "center_filter": "{{ 'x' | center(10**10) }}",
    "percent_width": "{{ '%999999999s' % 'x' }}",
    "format_width": "{{ '{:>999999999}'.format('x') }}",
    "format_filter_width": "{{ '%999999999s' | format('x') }}",
    "huge_output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
}


@pytest.mark.parametrize("name", list(RUNAWAY))
def test_a_runaway_template_ends_with_a_budget_error_within_two_seconds(name):
    template = ChatTemplate(RUNAWAY[name])
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="exceeded its budget"):
        template.render(HI)
    assert time.monotonic() - start < 2.0 + 1.5   # the 2 s budget, plus slack on a loaded machine


def test_the_budget_is_the_callers_to_set():
    loop = "{% for i in range(5000) %}{{ i }}{% endfor %}"
    assert ChatTemplate(loop).render(HI).endswith("4999")
    with pytest.raises(ChatTemplateError, match="more than 1004 operations"):
        ChatTemplate(loop, budget=TemplateBudget(max_ops=1000)).render(HI)


def test_the_allowance_grows_with_the_conversation():
    # a template that compares every message with every other is legitimate (gemma-4's does)
    quadratic = "{% for a in messages %}{% for b in messages %}.{% endfor %}{% endfor %}"
    many = [{"role": "user", "content": str(i)} for i in range(800)]
    budget = TemplateBudget(max_ops=100_000)
    assert len(ChatTemplate(quadratic, budget=budget).render(many, add_generation_prompt=False)) == 800 ** 2
    with pytest.raises(ChatTemplateError, match="budget"):
        ChatTemplate(quadratic, budget=TemplateBudget(max_ops=100_000, ops_per_message_squared=0)).render(many)


SECRET = os.getcwd()
ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.getcwd() }}",
    "{{ joiner.__init__.__globals__.os.getcwd() }}",
    "{{ namespace.__init__.__globals__.os.getcwd() }}",
    "{{ lipsum.__globals__['os'].getcwd() }}",
    "{{ raise_exception.__globals__['os'].getcwd() }}",
    "{{ strftime_now.__globals__['os'].getcwd() }}",
    "{{ self._TemplateReference__context }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.getcwd() }}",
    "{{ '{0.__class__}'.format(messages) }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.__init__.__globals__}'.format(cycler) }}",
    "{{ '{0[0].__class__}'.format(messages) }}",
    "{{ '%s' % ''.__class__ }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ (messages|first).__class__.__init__.__globals__ }}",
    "{{ range.__self__.__import__('os').getcwd() }}",
]


@pytest.mark.parametrize("payload", ESCAPES)
def test_attribute_escapes_reveal_nothing(payload):
    try:
        out = ChatTemplate(payload).render(HI)
    except ChatTemplateError as exc:
        assert "unsafe" in str(exc) or "undefined" in str(exc).lower()
        return
    assert out == ""   # the sandbox's undefined: nothing about the object, its class or the process
    assert SECRET not in out and "class" not in out


@pytest.mark.parametrize("payload", [
    "{{ messages.append(1) }}",
    "{{ (messages|first).update({'role': 'system'}) }}",
    "{{ messages.clear() }}",
])
def test_the_conversation_cannot_be_mutated(payload):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate(payload).render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("value", [7, 3.5, True, ["{{ x }}"], np.array([1, 2], np.uint32)])
def test_a_chat_template_that_is_not_a_string_is_a_clear_error(value):
    with pytest.raises(ChatTemplateError, match="tokenizer.chat_template must be a string"):
        ChatTemplate(value)


def test_from_gguf_metadata_with_confused_types_falls_back_or_fails_cleanly():
    meta = {"tokenizer.chat_template": np.array([1, 2, 3], np.uint32),
            "tokenizer.ggml.tokens": np.array([1.0]), "tokenizer.ggml.bos_token_id": "abc"}
    with pytest.raises(ChatTemplateError, match="must be a string"):
        ChatTemplate.from_gguf_metadata(meta.get)
    meta["tokenizer.chat_template"] = None
    template = ChatTemplate.from_gguf_metadata(meta.get)   # ChatML, no BOS text (the id was not an integer)
    assert template.is_fallback and template.bos_token == ""
