"""The Python API on the real default model: generate, stream, stop strings, prefix reuse, chat."""
from __future__ import annotations

import json
from collections import Counter

import gguf
import pytest

from ggflow.api import LLM, StopMatcher, default_model_path
from ggflow.errors import GGFlowError
from tests.fixtures.default_model import MISSING, needs_model



@pytest.fixture(scope="module")
def llm():
    if MISSING:
        pytest.skip(MISSING)
    return LLM(n_ctx=256, backend="cpu")


# -- stop strings (no model needed) -----------------------------------------------------------------
def test_a_stop_string_split_across_pieces_is_never_emitted():
    m = StopMatcher(["<|end|>"])
    out = [m.push(p)[0] for p in ["Hello <", "|e", "nd", "|> more"]]
    assert "".join(out) == "Hello " and m.hit and m.text == "Hello "


def test_text_that_only_looks_like_a_stop_start_is_released():
    m = StopMatcher(["STOP"])
    released = m.push("a ST")[0] + m.push("ar")[0] + m.push("", final=True)[0]
    assert released == "a STar" and not m.hit


# -- generation ----------------------------------------------------------------------------------
@needs_model
def test_greedy_generation_is_deterministic_and_streams_the_same_text(llm):
    a = llm.generate("The capital of France is", max_tokens=12, temperature=0)
    gen = llm.generate("The capital of France is", max_tokens=12, temperature=0, stream=True)
    pieces = list(gen)
    assert "".join(pieces) == a.text == gen.result.text
    assert gen.result.tokens == a.tokens and len(a.tokens) == 12 and a.finish_reason == "length"
    assert llm.detokenize(a.tokens) == a.text


@needs_model
def test_streamed_multibyte_text_is_valid_utf8_in_every_piece(llm):
    prompt = "Translate to Japanese and Chinese: good morning, friend! 日本語:"
    gen = llm.generate(prompt, max_tokens=24, temperature=0, stream=True)
    pieces = list(gen)
    for p in pieces:
        p.encode("utf-8")  # a lone surrogate or broken character would raise
    assert "".join(pieces) == gen.result.text == llm.detokenize(gen.result.tokens)


@needs_model
def test_a_second_call_with_the_same_prefix_evaluates_only_the_new_tokens(llm):
    prefix = "Once upon a time, in a land far away, there lived a king who had three daughters. " * 2
    first = llm.generate(prefix + "The eldest", max_tokens=2, temperature=0)
    second = llm.generate(prefix + "The youngest", max_tokens=2, temperature=0)
    n_prefix = len(llm.tokenize(prefix))
    assert second.timings.cached_n >= n_prefix - 1
    assert second.timings.prompt_n == len(second.prompt_tokens) - second.timings.cached_n
    assert second.timings.prompt_n < len(second.prompt_tokens) - n_prefix + 3
    # and the reuse did not change the result: a fresh model gives the same tokens
    fresh = LLM(n_ctx=256, backend="cpu").generate(prefix + "The youngest", max_tokens=2, temperature=0)
    assert fresh.tokens == second.tokens and first.timings.cached_n < n_prefix


@needs_model
def test_stop_strings_end_generation_and_are_not_returned(llm):
    full = llm.generate("Count: 1, 2, 3,", max_tokens=16, temperature=0)
    stop = full.text[4:7]
    assert stop
    cut = llm.generate("Count: 1, 2, 3,", max_tokens=16, temperature=0, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]


@needs_model
def test_max_tokens_beyond_the_context_stops_at_the_context(llm):
    small = LLM(n_ctx=24, backend="cpu")
    # a story opening: the greedy continuation runs on (an instruction such as "Write an essay" gets an
    # immediate end-of-generation token from this model, and so would never reach the context's end)
    prompt = small.tokenize("Once upon a time, there was")
    result = small.generate(prompt, max_tokens=1000, temperature=0)
    # the context holds 24 tokens and the last sampled one needs no slot: 25 - len(prompt) are generated.
    # The reference: the same greedy run in a context with room, cut at that count (no end-of-generation
    # token among them), so the small context ends it for "length".
    n_room = 24 + 1 - len(prompt)
    reference = llm.generate(prompt, max_tokens=n_room, temperature=0)
    assert reference.finish_reason == "length" and len(reference.tokens) == n_room
    assert result.tokens == reference.tokens and result.finish_reason == "length"


@needs_model
def test_a_prompt_longer_than_the_context_is_a_clear_error():
    small = LLM(n_ctx=16, backend="cpu")
    with pytest.raises(GGFlowError, match="context holds 16"):
        small.generate("word " * 40, max_tokens=4)


@needs_model
def test_token_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(GGFlowError, match="outside the vocabulary"):
        llm.generate([1, 2, 10**7], max_tokens=1)


@needs_model
def test_unknown_sampling_options_are_named(llm):
    with pytest.raises(GGFlowError, match="temprature"):
        llm.generate("hi", max_tokens=1, temprature=0.5)


@needs_model
def test_vocab_only_tokenizes_but_cannot_generate():
    v = LLM(vocab_only=True)
    assert v.detokenize(v.tokenize("hello world", add_special=False)) == "hello world"
    with pytest.raises(GGFlowError, match="vocab_only"):
        v.generate("hello", max_tokens=1)


# -- chat ----------------------------------------------------------------------------------------
@needs_model
def test_chat_completion_answers_in_openai_shape(llm):
    # SmolLM2's template adds its own system prompt when there is none; with it, this 135M model (and
    # llama.cpp running the same file) answers off topic, so the test gives a plain one.
    out = llm.create_chat_completion([{"role": "system", "content": "You are a helpful assistant."},
                                      {"role": "user", "content": "What is the capital of France?"}],
                                     max_tokens=24, temperature=0)
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and "Paris" in choice["message"]["content"]
    # the greedy answer ends with <|im_end|> before max_tokens: an end-of-generation token, so "stop"
    assert out["usage"]["completion_tokens"] < 24 and choice["finish_reason"] == "stop"
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]


@needs_model
def test_streamed_chat_chunks_add_up_to_the_answer(llm):
    messages = [{"role": "user", "content": "Name a color."}]
    whole = llm.create_chat_completion(messages, max_tokens=12, temperature=0)
    chunks = list(llm.create_chat_completion(messages, max_tokens=12, temperature=0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


# -- CLI -----------------------------------------------------------------------------------------
@needs_model
def test_cli_run_prints_json_with_timings(capsys):
    from ggflow.cli import main
    assert main(["run", "--prompt-ids", "1,4093,198", "-n", "4", "--temp", "0", "--json", "-c", "64"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    assert out["prompt_tokens"] == [1, 4093, 198] and len(out["tokens"]) == 4
    t = out["timings"]
    assert t["predicted_n"] == 4 and t["predicted_per_second"] == pytest.approx(4e3 / t["predicted_ms"])


@needs_model
def test_cli_run_with_text_and_a_bad_prompt_id(capsys):
    from ggflow.cli import main
    assert main(["run", "-p", "Hello", "-n", "2", "--temp", "0", "-c", "64"]) == 0
    assert "tokens/s" in capsys.readouterr().err
    assert main(["run", "--prompt-ids", "1,x", "-n", "2"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err


@needs_model
def test_cli_chat_reads_turns_from_stdin(monkeypatch, capsys):
    import io
    from ggflow.cli import main
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n/reset\nAnd of Italy?\n"))
    assert main(["chat", "--temp", "0", "-n", "16", "-c", "256", "-s", "You are a helpful assistant."]) == 0
    replies = capsys.readouterr().out.strip().splitlines()
    assert len(replies) == 2 and "Paris" in replies[0]


@needs_model
def test_cli_info_describes_the_model(capsys):
    from ggflow.cli import main
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "llama" and info["hparams"]["n_layer"] == 30
    assert info["has_chat_template"]
    stored = Counter(t.tensor_type.name for t in gguf.GGUFReader(default_model_path()).tensors)
    assert info["tensor_types"] == dict(stored) and info["tensor_types"]["Q4_1"] == stored["Q4_1"]
