"""Every public argument is checked before any work: a bad value is one ggflow error that names the argument,
the value and what is accepted; any value either works or raises such an error (hypothesis)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggflow.api import LLM, arguments as A
from ggflow.api.memory_estimate import check_context_fits, estimate_context_memory
from ggflow.errors import ArgumentError, ContextMemoryError, GGFlowError
from tests.fixtures.default_model import MISSING

N_VOCAB = 49152


@pytest.fixture(scope="module")
def llm():
    if MISSING:
        pytest.skip(MISSING)
    return LLM(n_ctx=64, backend="cpu")


# -- the checks themselves (no model) ------------------------------------------------------------------
def test_stop_as_a_string_is_one_stop_string():
    assert A.check_stop("END") == ["END"] and A.check_stop(["a", "b"]) == ["a", "b"]
    assert A.check_stop(None) == [] and A.check_stop("") == []


def test_max_tokens_none_or_not_positive_means_no_limit():
    assert A.check_max_tokens(None) is None and A.check_max_tokens(-1) is None and A.check_max_tokens(0) is None
    assert A.check_max_tokens(5) == 5


def test_logit_bias_keys_may_be_json_strings():
    assert A.check_logit_bias({"50": 1.5, 7: -math.inf}, N_VOCAB) == {50: 1.5, 7: -math.inf}


@pytest.mark.parametrize("call, name", [
    (lambda: A.check_stop([5]), "stop"),
    (lambda: A.check_stop(5), "stop"),
    (lambda: A.check_max_tokens("10"), "max_tokens"),
    (lambda: A.check_max_tokens(2.5), "max_tokens"),
    (lambda: A.check_seed(1.5), "seed"),
    (lambda: A.check_seed("abc"), "seed"),
    (lambda: A.check_seed(True), "seed"),
    (lambda: A.check_logit_bias({2**70: 5}, N_VOCAB), "logit_bias"),
    (lambda: A.check_logit_bias({"a": 1}, N_VOCAB), "logit_bias"),
    (lambda: A.check_logit_bias({1: float("nan")}, N_VOCAB), "logit_bias[1]"),
    (lambda: A.check_logit_bias([1, 2], N_VOCAB), "logit_bias"),
    (lambda: A.check_token_ids([1, 2**64], N_VOCAB), "prompt[1]"),
    (lambda: A.check_token_ids([1, -1], N_VOCAB), "prompt[1]"),
    (lambda: A.check_token_ids([1, 2.0], N_VOCAB), "prompt[1]"),
    (lambda: A.check_token_ids(np.zeros((2, 2), np.int32), N_VOCAB), "prompt"),
    (lambda: A.check_prompt(None, N_VOCAB), "prompt"),
    (lambda: A.check_text(None), "text"),
    (lambda: A.check_text(b"\xff"), "text"),
    (lambda: A.check_messages("hello"), "messages"),
    (lambda: A.check_messages([]), "messages"),
    (lambda: A.check_messages(["hi"]), "messages[0]"),
    (lambda: A.check_messages([None]), "messages[0]"),
    (lambda: A.check_messages([{"role": "wizard", "content": "hi"}]), "messages[0]['role']"),
    (lambda: A.check_messages([{"role": "user", "content": 5}]), "messages[0]['content']"),
    (lambda: A.check_messages([{"role": "user", "content": [{"type": "image_url"}]}]),
     "messages[0]['content'][0]"),
    (lambda: A.check_tools([{"type": "function"}]), "tools[0]"),
    (lambda: A.check_tool_choice("sometimes"), "tool_choice"),
    (lambda: A.check_sequence_breakers([123]), "dry_sequence_breakers[0]"),
    (lambda: A.check_n_ctx(-5), "n_ctx"),
    (lambda: A.sampling_params({"temprature": 0.5}, N_VOCAB), "temprature"),
    (lambda: A.sampling_params({"temperature": -1}, N_VOCAB), "temperature"),
    (lambda: A.sampling_params({"temperature": float("inf")}, N_VOCAB), "temperature"),
    (lambda: A.sampling_params({"top_p": 0}, N_VOCAB), "top_p"),
    (lambda: A.sampling_params({"top_p": 1.5}, N_VOCAB), "top_p"),
    (lambda: A.sampling_params({"top_k": -3}, N_VOCAB), "top_k"),
    (lambda: A.sampling_params({"min_p": 2}, N_VOCAB), "min_p"),
    (lambda: A.sampling_params({"mirostat": 3}, N_VOCAB), "mirostat"),
    (lambda: A.sampling_params({"dry_sequence_breakers": [123]}, N_VOCAB), "dry_sequence_breakers[0]"),
])
def test_a_bad_argument_is_an_argument_error_naming_it(call, name):
    with pytest.raises(ArgumentError) as info:
        call()
    assert info.value.name == name and str(info.value).startswith(f"{name}=")
    assert "\n" not in str(info.value)


def test_the_context_estimate_counts_every_layers_k_and_v():
    from ggflow.core.model import HParams
    hp = HParams(n_vocab=1000, n_ctx_train=2048, n_embd=64, n_layer=3, n_head=4, n_head_kv=2, n_ff=128,
                 n_embd_head_k=16, n_embd_head_v=16)
    est = estimate_context_memory(hp, 100, 32, "F16", "F32")
    assert est.kv_bytes == 3 * 128 * (32 * 2 + 32 * 4)    # 100 cells in whole pages of 64, as the cache holds them
    assert est.compute_bytes > 32 * 1000 * 4      # at least the logits of a ubatch
    with pytest.raises(ContextMemoryError, match=r"n_ctx=100 needs .* but 16.0 KiB of memory is available"):
        check_context_fits(hp, 100, 32, "F16", "F32", available=2**14)
    assert check_context_fits(hp, 100, 32, "F16", "F32", available=2**30) == est


# -- on an LLM ---------------------------------------------------------------------------------------
def test_a_context_too_large_for_memory_is_refused_with_the_figures():
    if MISSING:
        pytest.skip(MISSING)
    with pytest.raises(ContextMemoryError, match=r"n_ctx=1000000000 needs .* GiB .* available"):
        LLM(n_ctx=10**9, backend="cpu")


@pytest.mark.parametrize("kwargs, name", [
    ({"prompt": [1, 2**64]}, "prompt[1]"),
    ({"prompt": None}, "prompt"),
    ({"prompt": np.ones((2, 3), np.int64)}, "prompt"),
    ({"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "hi", "seed": 1.5}, "seed"),
    ({"prompt": "hi", "seed": "abc"}, "seed"),
    ({"prompt": "hi", "logit_bias": {2**70: 5}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"prompt": "hi", "stop": [5]}, "stop"),
    ({"prompt": "hi", "dry_multiplier": 0.8, "dry_sequence_breakers": [123]}, "dry_sequence_breakers[0]"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "logprobs": -1}, "logprobs"),
    ({"prompt": "hi", "suffix": "x"}, "suffix"),
    ({"prompt": "hi", "tfs_z": 0.5}, "tfs_z"),
])
def test_create_completion_names_a_bad_argument(llm, kwargs, name):
    with pytest.raises(ArgumentError) as info:
        llm.create_completion(**kwargs)
    assert info.value.name == name


@pytest.mark.parametrize("messages, name", [
    ("hello", "messages"), ([], "messages"), (["hi"], "messages[0]"), ([None], "messages[0]"),
    ([{"role": "narrator", "content": "x"}], "messages[0]['role']"),
])
def test_create_chat_completion_names_bad_messages(llm, messages, name):
    with pytest.raises(ArgumentError) as info:
        llm.create_chat_completion(messages, max_tokens=1)
    assert info.value.name == name


def test_stop_none_and_a_string_stop_work_in_generate(llm):
    assert llm.generate("hi", max_tokens=1, stop=None, temperature=0).tokens
    assert llm.generate("hi", max_tokens=1, stop="END", temperature=0).tokens


def test_tokenize_none_is_an_argument_error(llm):
    with pytest.raises(ArgumentError, match="text=None"):
        llm.tokenize(None)


def test_unknown_llm_options_are_named():
    if MISSING:
        pytest.skip(MISSING)
    with pytest.raises(ArgumentError, match="n_ctxx"):
        LLM(n_ctxx=64)


# -- any value: works or a ggflow error (hypothesis) ------------------------------------------------------
_any = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                 st.text(max_size=6), st.binary(max_size=4), st.lists(st.integers(-5, 2**66), max_size=3),
                 st.lists(st.text(max_size=3), max_size=3), st.dictionaries(st.integers(-3, 2**66),
                                                                             st.floats(), max_size=2))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "logit_bias",
                             "logprobs", "echo", "repeat_penalty", "typical_p", "mirostat_mode"]), value=_any)
def test_create_completion_with_any_value_works_or_raises_a_ggflow_error(llm, name, value):
    if name == "max_tokens" and isinstance(value, int) and not isinstance(value, bool):
        value = min(value, 1)  # (<= 0 stays: no limit, a full 64-token context)
    kwargs = {"max_tokens": 1, name: value}
    try:
        out = llm.create_completion("Hi", **kwargs)
    except GGFlowError as exc:
        assert "\n" not in str(exc)
        return
    assert out["object"] == "text_completion"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=_any)
def test_any_prompt_works_or_raises_a_ggflow_error(llm, prompt):
    try:
        llm.generate(prompt, max_tokens=1, temperature=0)
    except GGFlowError:
        pass


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.one_of(_any, st.lists(st.one_of(_any, st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": _any})), max_size=2)))
def test_any_messages_work_or_raise_a_ggflow_error(llm, messages):
    try:
        llm.create_chat_completion(messages, max_tokens=1, temperature=0)
    except GGFlowError:
        pass


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_any, add_bos=_any, special=_any)
def test_tokenize_and_detokenize_with_any_value_work_or_raise_a_ggflow_error(llm, text, add_bos, special):
    try:
        ids = llm.tokenize(text, add_bos, special)
    except GGFlowError:
        return
    assert isinstance(llm.detokenize(ids, special=True), bytes)


@pytest.mark.parametrize("kwargs, name", [
    ({"n_ctx": "abc"}, "n_ctx"), ({"n_ctx": -1}, "n_ctx"), ({"n_ctx": 1.5}, "n_ctx"), ({"seed": 1.5}, "seed"),
    ({"n_ubatch": 0}, "n_ubatch"), ({"context_shift": "yes"}, "context_shift"), ({"n_keep": -2}, "n_keep"),
    ({"model_path": 5}, "model_path"),
])
def test_llm_options_are_checked_before_loading(kwargs, name):
    with pytest.raises(ArgumentError) as info:
        LLM(**kwargs)
    assert info.value.name == name


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=_any, prev=st.one_of(st.none(), _any), special=_any)
def test_detokenize_with_any_value_works_or_raises_a_ggflow_error(llm, tokens, prev, special):
    try:
        out = llm.detokenize(tokens, prev, special)
    except GGFlowError:
        return
    assert isinstance(out, bytes)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["tools", "tool_choice", "functions", "logprobs", "top_logprobs", "stop", "seed",
                             "response_format", "temperature", "logit_bias", "stream"]), value=_any)
def test_create_chat_completion_with_any_value_works_or_raises_a_ggflow_error(llm, name, value):
    try:
        out = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=1, **{name: value})
        if name == "stream" and value is True:
            out = list(out)[-1]
    except GGFlowError as exc:
        assert "\n" not in str(exc)
        return
    assert out["object"].startswith("chat.completion")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(_any, st.lists(_any, max_size=2)), normalize=_any)
def test_embed_with_any_value_works_or_raises_a_ggflow_error(llm, value, normalize):
    try:
        out = llm.embed(value, normalize=normalize)
    except GGFlowError:
        return
    assert isinstance(out, list) and out
