"""llama-cpp-python's Llama surface on ggflow.LLM, on the real default model: a script written for
llama_cpp.Llama runs with only its import changed; each method returns llama-cpp-python's shapes."""
from __future__ import annotations

import math
import threading

import pytest

from ggflow.api import LLM, default_model_path
from ggflow.errors import GGFlowError
from tests.fixtures.default_model import MISSING


@pytest.fixture(scope="module")
def llm():
    if MISSING:
        pytest.skip(MISSING)
    return LLM(n_ctx=128, backend="cpu")


def llama_script(Llama, model_path):
    """Written against llama_cpp.Llama; only the class passed in differs."""
    llm = Llama(model_path=model_path, n_ctx=128, verbose=False, logits_all=True, n_gpu_layers=0, seed=1,
                embedding=True)
    out = {}
    c = llm("The capital of France is", max_tokens=6, temperature=0, echo=True, logprobs=2, stop="\n")
    out["echo"] = c["choices"][0]
    out["until_end"] = llm.create_completion("Q: Say hi. A:", max_tokens=-1, temperature=0, stop=["Q:", "\n"])
    chat = llm.create_chat_completion(
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    out["chat"] = chat
    state = llm.save_state()
    first = llm("Once upon a time", max_tokens=4, temperature=0)["choices"][0]["text"]
    llm.load_state(state)
    out["state"] = (first, state.n_tokens)
    out["sizes"] = (llm.n_ctx(), llm.n_vocab(), llm.token_bos(), llm.token_eos())
    out["tokens"] = llm.detokenize(llm.tokenize(b"Hello world", add_bos=False))
    out["embedding"] = llm.create_embedding(["Hello world", "The sea"])
    out["embed"] = llm.embed("Hello world", normalize=True)
    return out


def test_a_llama_cpp_python_script_runs_with_only_the_import_changed():
    if MISSING:
        pytest.skip(MISSING)
    from ggflow import Llama              # was: from llama_cpp import Llama

    out = llama_script(Llama, default_model_path())
    echo = out["echo"]
    assert echo["text"].startswith("The capital of France is") and "Paris" in echo["text"]
    lp = echo["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None   # as llama-cpp-python echoes
    assert len(lp["tokens"]) == len(lp["text_offset"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    assert all(v <= 0 for v in lp["token_logprobs"][1:]) and all(len(t) >= 1 for t in lp["top_logprobs"][1:])
    assert "".join(lp["tokens"]).startswith(echo["text"])  # (the tokens include the stop string's)
    until_end = out["until_end"]["choices"][0]
    assert until_end["finish_reason"] == "stop" and "\n" not in until_end["text"]
    chat = out["chat"]["choices"][0]
    assert "Paris" in chat["message"]["content"]
    content = chat["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == chat["message"]["content"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    first, n_saved = out["state"]
    assert first and n_saved > 0
    n_ctx, n_vocab, bos, eos = out["sizes"]
    assert (n_ctx, n_vocab) == (128, 49152) and eos >= 0 and bos >= 0
    assert out["tokens"] == b"Hello world"
    emb = out["embedding"]
    assert emb["object"] == "list" and [d["index"] for d in emb["data"]] == [0, 1]
    assert emb["usage"]["prompt_tokens"] == emb["usage"]["total_tokens"] > 0
    per_token = out["embed"]              # SmolLM2 has no pooling type: one unit vector per token
    assert len(per_token) == 2 and all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in per_token)


# -- completions -----------------------------------------------------------------------------------
def test_call_is_create_completion_and_returns_a_text_completion(llm):
    a = llm("The capital of France is", max_tokens=4, temperature=0)
    b = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)
    assert a["object"] == "text_completion" and a["id"].startswith("cmpl-")
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["finish_reason"] == "length" and a["usage"]["completion_tokens"] == 4
    assert a["usage"]["total_tokens"] == a["usage"]["prompt_tokens"] + 4


def test_a_stop_string_is_one_string_not_its_characters(llm):
    full = llm("Count: 1, 2, 3,", max_tokens=12, temperature=0)["choices"][0]["text"]
    stop = full[2:5]
    cut = llm("Count: 1, 2, 3,", max_tokens=12, temperature=0, stop=stop)["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == full[: full.find(stop)]
    assert llm("Count: 1, 2, 3,", max_tokens=12, temperature=0, stop=None)["choices"][0]["text"] == full


def test_max_tokens_minus_one_or_none_runs_to_a_full_context():
    if MISSING:
        pytest.skip(MISSING)
    small = LLM(n_ctx=32, backend="cpu")
    prompt = "Write a very long story about a dragon who"
    for limit in (-1, None, 0):
        out = small(prompt, max_tokens=limit, temperature=0, logit_bias={small.token_eos(): -math.inf})
        choice = out["choices"][0]
        assert choice["finish_reason"] == "length" and out["usage"]["total_tokens"] == 32


def test_the_logprobs_of_a_completion_are_those_of_the_model(llm):
    import numpy as np

    out = llm("The capital of France is", max_tokens=3, temperature=0, logprobs=3)["choices"][0]
    lp = out["logprobs"]
    assert "".join(lp["tokens"]) == out["text"]
    assert lp["text_offset"][0] == len("The capital of France is")
    for token, top, chosen in zip(lp["tokens"], lp["top_logprobs"], lp["token_logprobs"]):
        assert top[token] == chosen and max(top.values()) == chosen  # greedy picks the most likely
        assert len(top) == 3
    # the first token's log-probability, from the logits of the prompt's last token
    logits, _ = llm.eval_prompt(llm.tokenize("The capital of France is"))
    x = logits.astype(np.float64)
    expected = x.max() - x.max() - np.log(np.exp(x - x.max()).sum())
    assert lp["token_logprobs"][0] == pytest.approx(expected, abs=1e-4)


def test_streamed_completion_chunks_add_up_to_the_whole(llm):
    whole = llm("Once upon a time", max_tokens=8, temperature=0)["choices"][0]
    chunks = list(llm("Once upon a time", max_tokens=8, temperature=0, stream=True, logprobs=1))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks[:-1]) == 8


def test_a_seed_repeats_a_sampled_completion(llm):
    a = llm("Once upon a time", max_tokens=6, temperature=1.0, seed=42)["choices"][0]["text"]
    b = llm("Once upon a time", max_tokens=6, temperature=1.0, seed=42)["choices"][0]["text"]
    assert a == b


# -- chat ---------------------------------------------------------------------------------------------
def test_tools_reach_the_chat_template(llm):
    tools = [{"type": "function", "function": {"name": "get_weather_in_city", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {}}}}]
    from ggflow.core.chat_template import ChatTemplate

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    own = llm.chat_template()
    # SmolLM2's own template ignores tools; one that lists them shows they arrive
    llm._template = ChatTemplate("{% for t in tools or [] %}[{{ t.function.name }}|{{ tool_choice }}]{% endfor %}"
                                 "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    try:
        with_tools = llm.chat_prompt_tokens(messages, tools=tools, tool_choice="auto")
        without = llm.chat_prompt_tokens(messages)
        assert llm.detokenize(with_tools).text.startswith("[get_weather_in_city|auto]user: Weather in Paris?")
        assert "get_weather_in_city" not in llm.detokenize(without).text
        out = llm.create_chat_completion(messages, tools=tools, tool_choice="auto", max_tokens=2, temperature=0)
        # a template that shows no tool-call syntax gets the generic format: its system note comes first
        calling = llm.tool_calling(tools, "auto")
        assert calling.fmt.name == "generic"
        shown = llm.chat_prompt_tokens(messages, tools=tools, tool_choice="auto", calling=calling)
        assert out["usage"]["prompt_tokens"] == len(shown) > len(with_tools)
    finally:
        llm._template = own


def test_streamed_chat_chunks_carry_logprobs(llm):
    messages = [{"role": "user", "content": "Name a color."}]
    chunks = list(llm.create_chat_completion(messages, max_tokens=6, temperature=0, stream=True,
                                             logprobs=True, top_logprobs=1))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    tokens = "".join(e["token"] for c in chunks[1:-1] for e in c["choices"][0]["logprobs"]["content"])
    assert text and tokens == text


# -- tokens, sizes, state ------------------------------------------------------------------------------
def test_tokenize_takes_bytes_or_str_and_detokenize_gives_bytes(llm):
    ids = llm.tokenize(b"Hello world", add_bos=False)
    assert ids == llm.tokenize("Hello world", add_special=False)
    out = llm.detokenize(ids)
    assert isinstance(out, bytes) and out == b"Hello world" and out.text == "Hello world"
    assert llm.detokenize(ids[1:], prev_tokens=ids[:1]) == b" world"
    assert llm.tokenize("<|im_end|>", add_bos=False, special=True) == [llm.vocab.text_to_token("<|im_end|>")]


def test_a_continuation_after_load_state_is_the_one_without_saving(llm):
    prompt = llm.tokenize("The three primary colors are")
    first = llm.generate(prompt, max_tokens=4, temperature=0)
    state = llm.save_state()
    more = prompt + first.tokens + llm.tokenize(" and", add_bos=False)
    straight = llm.generate(more, max_tokens=6, temperature=0)
    llm.generate("Something else entirely, to overwrite the cache.", max_tokens=3, temperature=0)
    llm.load_state(state)
    resumed = llm.generate(more, max_tokens=6, temperature=0)
    assert resumed.tokens == straight.tokens
    assert resumed.timings.cached_n == straight.timings.cached_n >= len(prompt) + 3


def test_load_state_into_a_fresh_llm_continues_the_same():
    if MISSING:
        pytest.skip(MISSING)
    a, b = LLM(n_ctx=64, backend="cpu"), LLM(n_ctx=64, backend="cpu")
    prompt = a.tokenize("Once upon a time, a fox")
    a.generate(prompt, max_tokens=2, temperature=0)
    b.load_state(a.save_state())
    more = prompt + a.tokenize(" jumped", add_bos=False)
    assert a.generate(more, max_tokens=5, temperature=0).tokens == b.generate(more, max_tokens=5,
                                                                                temperature=0).tokens
    with pytest.raises(GGFlowError, match="n_ctx=32"):
        LLM(n_ctx=32, backend="cpu").load_state(a.save_state())


def test_reset_forgets_the_cached_prompt(llm):
    llm.generate("The capital of France is", max_tokens=1, temperature=0)
    again = llm.generate("The capital of France is", max_tokens=1, temperature=0)
    assert again.timings.cached_n > 0
    llm.reset()
    fresh = llm.generate("The capital of France is", max_tokens=1, temperature=0)
    assert fresh.timings.cached_n == 0 and fresh.tokens == again.tokens


# -- embeddings ------------------------------------------------------------------------------------------
def test_an_embedding_is_the_hidden_state_lm_head_turns_into_logits(llm):
    import numpy as np

    from ggflow import dequantize

    text = "The capital of France is"
    hidden = np.array(llm.embed(text))                        # [n_tokens, n_embd]: no pooling in SmolLM2
    tokens = llm.tokenize(text)
    assert hidden.shape == (len(tokens), llm.n_embd())
    logits, _ = llm.eval_prompt(tokens)
    weights = llm.model.weights
    w = weights["output.weight"] if "output.weight" in weights else weights["token_embd.weight"]  # tied
    table = dequantize(w.numpy().reshape(llm.n_vocab(), -1), w.type.name)     # [n_vocab, n_embd]
    again = table @ hidden[-1]
    cos = float(again @ logits / np.linalg.norm(again) / np.linalg.norm(logits))
    assert cos > 0.999 and int(again.argmax()) == int(logits.argmax())


def test_pooled_embeddings_are_the_mean_first_or_last_token():
    if MISSING:
        pytest.skip(MISSING)
    import numpy as np

    text = "Hello world, the sea is blue."
    per_token = np.array(LLM(n_ctx=64, backend="cpu").embed(text))
    for kind, expected in (("mean", per_token.mean(0)), ("cls", per_token[0]), ("last", per_token[-1])):
        pooled = LLM(n_ctx=64, backend="cpu", pooling_type=kind)
        assert np.allclose(pooled.embed(text), expected, atol=1e-5)
        unit = np.array(pooled.embed([text, "Paris"], normalize=True))
        assert unit.shape == (2, per_token.shape[1]) and np.allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-5)


def test_generation_after_an_embedding_is_unchanged(llm):
    before = llm.generate("Once upon a time", max_tokens=4, temperature=0).tokens
    llm.create_embedding("Something else")
    after = llm.generate("Once upon a time", max_tokens=4, temperature=0)
    assert after.tokens == before and after.timings.cached_n == 0


# -- a full context -------------------------------------------------------------------------------------
def test_a_full_context_ends_the_completion_and_says_so():
    if MISSING:
        pytest.skip(MISSING)
    small = LLM(n_ctx=24, backend="cpu")
    out = small.generate("Write a long essay about the sea.", max_tokens=None, temperature=0,
                         logit_bias={small.token_eos(): -math.inf})
    assert out.finish_reason == "length" and out.context_full
    assert len(out.prompt_tokens) + len(out.tokens) == 25  # the last sampled token found no room
    assert not small.generate("Hi", max_tokens=2, temperature=0).context_full


def test_context_shift_keeps_generating_past_a_full_context():
    if MISSING:
        pytest.skip(MISSING)
    small = LLM(n_ctx=32, backend="cpu", context_shift=True, n_keep=4)
    out = small.generate("Write a long essay about the sea.", max_tokens=60, temperature=0,
                         logit_bias={small.token_eos(): -math.inf})
    assert len(out.tokens) == 60 and out.finish_reason == "length" and not out.context_full
    assert out.n_context_shifts >= 2
    n_kept = 4 + (out.prompt_tokens[0] == small.token_bos())  # n_keep tokens (and a BOS) stay at the front
    assert small._cached[:n_kept] == out.prompt_tokens[:n_kept]
    evaluated = (out.prompt_tokens + out.tokens)[:-1]     # the last sampled token was never evaluated
    assert small._cached[n_kept:] == evaluated[-(len(small._cached) - n_kept):]
    assert small.context.memory.seq_pos_max(0) == len(small._cached) - 1
    # the shifted cache is not reused beyond n_keep: a new prompt evaluates the rest afresh
    again = small.generate(small._cached[:20], max_tokens=1, temperature=0)
    assert again.timings.cached_n <= n_kept


# -- threads ------------------------------------------------------------------------------------------
def test_two_threads_on_one_llm_get_their_own_output(llm):
    prompts = ["The capital of France is", "Once upon a time, in a land"]
    alone = [llm.generate(p, max_tokens=8, temperature=0).tokens for p in prompts]
    results: dict[int, list] = {}
    errors = []

    def worker(i: int) -> None:
        try:
            got = []
            for _ in range(2):
                gen = llm.generate(prompts[i], max_tokens=8, temperature=0, stream=True)
                "".join(gen)
                got.append(gen.result.tokens)
            results[i] = got
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and all(not t.is_alive() for t in threads)
    assert results[0] == [alone[0]] * 2 and results[1] == [alone[1]] * 2
    assert llm.generate(prompts[0], max_tokens=8, temperature=0).tokens == alone[0]  # the next call is sound


def test_a_new_call_ends_this_threads_unfinished_stream(llm):
    gen = llm.generate("Once upon a time", max_tokens=20, temperature=0, stream=True)
    next(gen)
    other = llm.generate("The capital of France is", max_tokens=3, temperature=0)
    assert other.tokens == llm.generate("The capital of France is", max_tokens=3, temperature=0).tokens
    assert list(gen) == []   # the superseded stream ended instead of decoding into a changed cache


def test_a_call_back_into_the_llm_from_its_own_generation_is_refused_not_deadlocked(llm):
    def processor(ids, logits):
        llm.generate("again", max_tokens=1)
        return logits

    with pytest.raises(GGFlowError, match="from inside one of its own running calls"):
        llm.generate("Hi", max_tokens=2, logits_processor=processor)
    assert llm.generate("Hi", max_tokens=2, temperature=0).tokens  # the LLM is usable afterwards


def test_a_conversation_with_a_tool_call_and_its_result_renders(llm):
    messages = [{"role": "user", "content": "What is 6 times 7?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "1", "type": "function", "function": {"name": "mul", "arguments": "{}"}}]},
                {"role": "tool", "content": "42"}]
    text = llm.detokenize(llm.chat_prompt_tokens(messages), special=True).text
    assert "What is 6 times 7?" in text and "42" in text


def test_a_context_in_embeddings_mode_outputs_the_normed_hidden_state(tmp_path):
    """On a tiny F32 llama: hidden states times the output matrix are the logits, exactly up to rounding."""
    import numpy as np

    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    from tests.fixtures.tiny_models import write_tiny_model

    model = Model.load(write_tiny_model(tmp_path / "tiny.gguf", "llama"))
    ctx = Context(model, n_ctx=64, backends="cpu")
    tokens = [1, 5, 9, 14, 3]
    assert ctx.decode(Batch.from_tokens(tokens, all_logits=True)) == 0
    logits = ctx.get_logits().copy()
    ctx.memory.seq_rm(0, 0, -1)
    ctx.set_embeddings(True)
    assert ctx.decode(Batch.from_tokens(tokens, all_logits=True)) == 0
    hidden = ctx.get_embeddings()
    assert hidden.shape == (len(tokens), model.hparams.n_embd)
    w = model.weights.get("output.weight", model.weights["token_embd.weight"])
    np.testing.assert_allclose(hidden @ w.numpy().reshape(model.hparams.n_vocab, -1).T, logits, rtol=1e-4, atol=1e-4)
    ctx.set_embeddings(False)
    ctx.memory.seq_rm(0, 0, -1)
    assert ctx.decode(Batch.from_tokens(tokens, all_logits=True)) == 0
    np.testing.assert_array_equal(ctx.get_logits(), logits)   # logits again after switching back


def test_a_grammar_or_response_format_constrains_the_output(llm):
    import importlib.util
    import json

    if importlib.util.find_spec("llguidance") is None:
        pytest.skip("the grammar extra (llguidance) is not installed")
    text = llm("Is the sky blue? The answer is", max_tokens=8, temperature=0,
               grammar='root ::= " yes" | " no"')["choices"][0]["text"]
    assert text in (" yes", " no")
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    out = llm.create_chat_completion([{"role": "user", "content": "Give me a JSON object with a name."}],
                                     max_tokens=40, temperature=0, response_format=fmt)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop" and set(json.loads(choice["message"]["content"])) == {"name"}
