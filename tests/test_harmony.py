"""gpt-oss's harmony replies split into reasoning_content (the analysis channel) and content (final), as
llama.cpp's server splits them: the parser on rendered text, and create_chat_completion on a tiny gpt-oss
whose reply is scripted token by token (a logits processor forcing each next token)."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.api.harmony import is_harmony, split_reply


def test_analysis_then_final():
    text = "<|channel|>analysis<|message|>think hard<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>"
    assert split_reply(text) == ("think hard", "42")


def test_text_without_messages_is_all_content():
    assert split_reply("plain words") == (None, "plain words")


def test_a_reply_cut_off_in_its_analysis_has_no_content_yet():
    assert split_reply("<|channel|>analysis<|message|>still thinking") == ("still thinking", "")


def test_commentary_and_constrained_headers_go_to_the_content():
    text = ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
            "<|start|>assistant<|channel|>final<|message|>done<|return|>")
    assert split_reply(text) == (None, "{}done")


def test_only_templates_with_channels_are_harmony():
    assert is_harmony("<|start|>{{ m.role }}<|channel|>final<|message|>")
    assert not is_harmony("<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>")


def test_chat_completion_of_gpt_oss_surfaces_reasoning(tmp_path):
    pytest.importorskip("torch", reason="the tiny gpt-oss is made in transformers (torch 2.13.0)")
    pytest.importorskip("transformers", minversion="5.0", reason="the fixture writes from transformers 5's layouts")
    from ggflow.api.llm import LLM
    from tests.fixtures.tiny_moe import write_tiny_moe
    path = tmp_path / "gpt-oss.gguf"
    write_tiny_moe(path, "gpt-oss", harmony=True)
    llm = LLM(str(path), n_ctx=128, verbose=False)
    v = llm.vocab
    ids = {t: v.text_to_token(t) for t in ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>",
                                         "analysis", "final", "assistant"]}
    def word(text):
        return v.tokenize(text, add_special=False)
    script = ([ids["<|channel|>"], ids["analysis"], ids["<|message|>"], *word("hmm"), ids["<|end|>"],
               ids["<|start|>"], ids["assistant"], ids["<|channel|>"], ids["final"], ids["<|message|>"],
               *word("yes"), ids["<|return|>"]])
    n_prompt = []

    def force(input_ids, scores):
        if not n_prompt:
            n_prompt.append(len(input_ids))
        forced = np.full_like(scores, -np.inf)
        forced[script[len(input_ids) - n_prompt[0]]] = 0.0
        return forced
    out = llm.create_chat_completion([{"role": "user", "content": "hi"}], logits_processor=force,
                                     max_tokens=len(script) + 2, temperature=0.0)
    message = out["choices"][0]["message"]
    assert message["reasoning_content"] == "hmm" and message["content"] == "yes"
    assert out["choices"][0]["finish_reason"] == "stop"
