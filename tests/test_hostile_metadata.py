"""Metadata a loader must not trust: one test per root cause the GGUF fuzzer found (benchmarks/fuzz_gguf.py).

Each test writes a tiny model (tests/fixtures) with one key given a hostile value and asserts that ggflow
refuses it at load, naming the key, as llama.cpp's get_key does; or, where the value is legal, that the
model still runs. Nothing here may raise anything but a ggflow.errors error, nor take more than a second.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from ggflow.core.chat_template import ChatTemplate
from ggflow.core.gguf_file import ARRAY, STRING
from ggflow.core.model import Model
from ggflow.errors import ChatTemplateError, ModelLoadError
from tests import gguf_fuzz as fz

I32, U32, U64, F32, BOOL = fz.I32, fz.U32, fz.U64, fz.F32, fz.BOOL


def hostile(seed: Path, out: Path, **changes) -> Path:
    """``seed`` with each key (dots written as __) set to (vtype, value[, itype]), or deleted by None."""
    img = fz.read_image(seed)
    for name, change in changes.items():
        key = name.replace("__", ".")
        kv = img.kv(key)
        if change is None:
            img.kvs.remove(kv)
            continue
        vtype, value, *itype = change
        new = fz.KV(key, vtype, value, itype[0] if itype else None)
        if kv is None:
            img.kvs.append(new)
        else:
            img.kvs[img.kvs.index(kv)] = new
    out.write_bytes(fz.serialize(img))
    return out


@pytest.fixture
def llama(tiny_model_path, tmp_path):
    seed = tiny_model_path("llama")
    return lambda **changes: hostile(seed, tmp_path / "hostile.gguf", **changes)


def refused(path: Path, *patterns: str) -> str:
    start = time.monotonic()
    with pytest.raises(ModelLoadError) as info, fz.time_budget(10.0):   # a hang fails, not stalls, the run
        model = Model.load(path)
        model.vocab   # the tokenizer keys are read here
    assert time.monotonic() - start < 1.0
    message = str(info.value)
    for p in patterns:
        assert p in message, message
    return message


# -- hyperparameters: type, range, required ---------------------------------------------------------
@pytest.mark.parametrize("value, found", [((STRING, "abc"), "str 'abc'"), ((F32, math.nan), "f32 nan"),
                                          ((ARRAY, np.array([1, 2]), U32), "array of 2 u32"),
                                          ((BOOL, True), "bool True")])
def test_block_count_of_another_type_is_named_with_what_was_found(llama, value, found):
    refused(llama(llama__block_count=value), "'llama.block_count'", "must be an integer", found)


@pytest.mark.parametrize("value", [(U64, 2**63), (U64, 2**64 - 1), (U32, 513)])
def test_a_huge_block_count_is_refused_at_once_not_built_until_memory_runs_out(llama, value):
    refused(llama(llama__block_count=value), "'llama.block_count'", "outside [1, 512]")


@pytest.mark.parametrize("value", [(U32, 0), (I32, -1)])
def test_a_block_count_of_zero_or_less_is_refused_as_llama_cpp_does(llama, value):
    refused(llama(llama__block_count=value), "'llama.block_count'", "outside [1, 512]")


def test_a_context_length_of_2_63_is_refused_before_the_rope_cache_overflows(llama):
    refused(llama(llama__context_length=(U64, 2**63)), "'llama.context_length'", "outside")


@pytest.mark.parametrize("key", ["llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_key_must_be_finite(llama, key, value):
    refused(llama(**{key.replace(".", "__"): (F32, value)}), repr(key), "finite")


@pytest.mark.parametrize("key", ["llama.context_length", "llama.embedding_length", "llama.block_count",
                                 "llama.attention.head_count", "llama.feed_forward_length",
                                 "llama.attention.layer_norm_rms_epsilon"])
def test_a_key_llama_cpp_requires_is_required(llama, key):
    refused(llama(**{key.replace(".", "__"): None}), f"required metadata key {key!r} is missing")


def test_gpt2_requires_its_layer_norm_epsilon(tiny_model_path, tmp_path):
    path = hostile(tiny_model_path("gpt2"), tmp_path / "g.gguf", gpt2__attention__layer_norm_epsilon=None)
    refused(path, "'gpt2.attention.layer_norm_epsilon' is missing")


def test_an_architecture_name_of_another_type_is_named(llama):
    refused(llama(general__architecture=(U32, 7)), "'general.architecture'", "must be a string")


# -- vocabulary --------------------------------------------------------------------------------------
def test_a_tokens_array_shorter_than_vocab_size_is_refused_at_load(llama, tiny_model_path):
    n = len(fz.read_image(tiny_model_path("llama")).kv("tokenizer.ggml.tokens").value)
    refused(llama(llama__vocab_size=(U32, n + 10)), "'llama.vocab_size'", str(n))


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"])
@pytest.mark.parametrize("value", [(STRING, "abc"), (F32, 1.5), (ARRAY, np.array([1]), U32)])
def test_a_special_token_id_of_another_type_is_named(llama, key, value):
    refused(llama(**{f"tokenizer__ggml__{key}": value}), f"'tokenizer.ggml.{key}'", "must be an integer")


@pytest.mark.parametrize("key", ["scores", "token_type"])
@pytest.mark.parametrize("value", [(U32, 7), (STRING, "abc"), (ARRAY, ["a", "b"], STRING)])
def test_a_per_token_array_that_is_a_scalar_or_strings_is_named(llama, key, value):
    refused(llama(**{f"tokenizer__ggml__{key}": value}), f"'tokenizer.ggml.{key}'", "must be an array of")


@pytest.mark.parametrize("value", [(ARRAY, np.array([1, 2, 3]), U32), (STRING, "a b"), (U32, 3)])
def test_merges_that_are_not_a_string_array_are_named(tiny_model_path, tmp_path, value):
    path = hostile(tiny_model_path("qwen2"), tmp_path / "q.gguf", tokenizer__ggml__merges=value)
    refused(path, "'tokenizer.ggml.merges'", "must be an array of str")


@pytest.mark.parametrize("key", ["model", "pre"])
@pytest.mark.parametrize("value", [(U32, 7), (ARRAY, ["gpt2"], STRING)])
def test_tokenizer_model_and_pre_must_be_strings(tiny_model_path, tmp_path, key, value):
    path = hostile(tiny_model_path("qwen2"), tmp_path / "q.gguf", **{f"tokenizer__ggml__{key}": value})
    refused(path, f"'tokenizer.ggml.{key}'", "must be a string")


@pytest.mark.parametrize("value", [(ARRAY, np.arange(5), U32), (STRING, "abc"), (U32, 5)])
def test_tokens_that_are_not_strings_are_named(llama, value):
    refused(llama(tokenizer__ggml__tokens=value), "'tokenizer.ggml.tokens'", "must be an array of str")


@pytest.mark.parametrize("key", ["add_bos_token", "add_eos_token", "add_space_prefix"])
@pytest.mark.parametrize("value", [(ARRAY, np.array([True]), BOOL), (STRING, "yes"), (U32, 1)])
def test_tokenizer_flags_must_be_bools(llama, key, value):
    refused(llama(**{f"tokenizer__ggml__{key}": value}), f"'tokenizer.ggml.{key}'", "must be a bool")


# -- chat template -----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [(U32, 7), (ARRAY, ["{{ x }}"], STRING)])
def test_a_chat_template_of_another_type_is_a_chat_template_error(llama, value):
    model = Model.load(llama(tokenizer__chat_template=value))
    with pytest.raises(ChatTemplateError, match="tokenizer.chat_template must be a string"):
        ChatTemplate.for_vocab(model.metadata.get("tokenizer.chat_template"), model.vocab)


def test_a_nested_loop_chat_template_in_the_file_does_not_hang_chat_completion(llama):
    from ggflow.api import LLM

    loop = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    llm = LLM(str(llama(tokenizer__chat_template=(STRING, loop))), n_ctx=32, backend="cpu")
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="budget"):
        llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=2)
    assert time.monotonic() - start < 4.0


# -- what is legal still runs ----------------------------------------------------------------------
def test_an_integer_key_written_as_another_integer_type_still_loads(llama):
    # writers differ (u32 / i32 / u64) for the same key; llama.cpp's converters agree, ggflow accepts any
    model = Model.load(llama(llama__block_count=(U64, 2), llama__context_length=(I32, 256)))
    assert (model.hparams.n_layer, model.hparams.n_ctx_train) == (2, 256)


def test_the_cli_prints_an_error_not_a_traceback(llama, capsys):
    from ggflow.cli import main

    assert main(["info", "-m", str(llama(llama__block_count=(STRING, "abc")))]) != 0
    err = capsys.readouterr().err
    assert "error:" in err and "llama.block_count" in err and "Traceback" not in err


def test_the_largest_context_length_llama_cpp_can_pass_to_ggml_still_runs(llama, tmp_path):
    # 2**31 - 1 is the bound (ggml takes n_ctx_orig as int32); the rope cache must not overflow below it
    path = llama(llama__context_length=(U32, 2**31 - 1))
    outcome = fz.run_case(path.read_bytes(), tmp_path / "max-ctx.gguf", budget_s=120)
    assert outcome.kind == "ran", outcome.detail
