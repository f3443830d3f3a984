"""llama-server's native routes on ggflow serve: /completion, /infill, /apply-template, /props, /tokenize
with_pieces. The shapes are llama.cpp's (tools/server/tests and server-task.cpp); the generated text is
checked against ggflow's OpenAI route on the same greedy request, which test_serving_http checks against LLM."""
from __future__ import annotations

import json
import math

import httpx
import pytest

from tests.fixtures.default_model import needs_model

pytestmark = needs_model

TIMEOUT_S = 120
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server():
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    engine = Engine.load(default_model_path(), n_ctx=512, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine)) as url:
        yield url


@pytest.fixture()
def h(server):
    with httpx.Client(base_url=server, timeout=TIMEOUT_S) as client:
        yield client


def _native(h, **body):
    r = h.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_native_shape_and_text_as_the_openai_route(h):
    body = _native(h, prompt=PROMPT, n_predict=6, temperature=0, return_tokens=True)
    oai = h.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0}).json()
    assert body["content"] == oai["choices"][0]["text"]
    assert body["stop"] is True and body["stop_type"] == "limit" and body["truncated"] is False
    assert body["tokens_predicted"] == 6 and len(body["tokens"]) == 6
    assert body["tokens_evaluated"] == oai["usage"]["prompt_tokens"]
    t = body["timings"]
    assert t["predicted_n"] == 6 and t["prompt_n"] + t["cache_n"] == body["tokens_evaluated"]
    assert body["generation_settings"]["n_predict"] == 6 and isinstance(body["has_new_line"], bool)
    assert _native(h, prompt=PROMPT, n_predict=2)["tokens"] == []   # return_tokens false


def test_completion_prompt_forms(h):
    tokens = h.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    base = _native(h, prompt=PROMPT, n_predict=4, temperature=0)["content"]
    assert _native(h, prompt=tokens, n_predict=4, temperature=0)["content"] == base
    batch = _native(h, prompt=[tokens, PROMPT, {"prompt_string": PROMPT}], n_predict=4, temperature=0)
    assert [b["content"] for b in batch] == [base] * 3 and [b["index"] for b in batch] == [0, 1, 2]
    mixed = _native(h, prompt=[*tokens[:2], h.post("/detokenize", json={"tokens": tokens[2:]}).json()["content"]],
                    n_predict=2, temperature=0)
    assert isinstance(mixed["content"], str)


def test_completion_stop_word_and_eos(h):
    full = _native(h, prompt=PROMPT, n_predict=8, temperature=0)["content"]
    word = full.strip().split()[0]
    stopped = _native(h, prompt=PROMPT, n_predict=8, temperature=0, stop=[word])
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    assert stopped["content"] == full[:full.index(word)]


def test_completion_n_probs_logprob_and_post_sampling(h):
    body = _native(h, prompt=PROMPT, n_predict=3, temperature=0, n_probs=5)
    probs = body["completion_probabilities"]
    assert len(probs) == 3
    for tok in probs:
        assert tok["logprob"] <= 0 and len(tok["top_logprobs"]) == 5
        assert bytes(tok["bytes"]).decode("utf-8", "ignore") == tok["token"]
        assert tok["id"] == tok["top_logprobs"][0]["id"]   # greedy: the chosen token is the most likely
        lps = [x["logprob"] for x in tok["top_logprobs"]]
        assert lps == sorted(lps, reverse=True)
    post = _native(h, prompt=PROMPT, n_predict=3, temperature=0, n_probs=5, post_sampling_probs=True)
    for a, b in zip(probs, post["completion_probabilities"]):
        assert b["prob"] == pytest.approx(math.exp(a["logprob"]), rel=1e-5) and len(b["top_probs"]) == 5


def test_completion_stream_pieces_then_final(h):
    whole = _native(h, prompt=PROMPT, n_predict=6, temperature=0)
    chunks = []
    with h.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 6, "temperature": 0, "stream": True,
                                               "n_probs": 2}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["stop_type"] == "limit" and chunks[-1]["timings"]["predicted_n"] == 6
    assert all(len(c["completion_probabilities"]) == 1 for c in chunks[:-1] if c["content"])
    assert all(len(c["tokens"]) == 1 for c in chunks[:-1])   # llama.cpp's test_completion_stream


def test_completion_response_fields(h):
    body = _native(h, prompt=PROMPT, n_predict=3, response_fields=["content", "generation_settings/n_predict"])
    assert set(body) == {"content", "generation_settings/n_predict"} and body["generation_settings/n_predict"] == 3


@pytest.mark.parametrize("body, words", [
    ({}, "prompt is required"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [[1, 2], 3.5]}, "prompt[1]"),
    ({"prompt": [1, None]}, "item 1"),
    ({"prompt": {"prompt_string": 3}}, "prompt_string"),
    ({"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}}, "vision"),
    ({"prompt": [10 ** 9]}, "outside the vocabulary"),
    ({"prompt": "x", "n_probs": -1}, "n_probs"),
    ({"prompt": "x", "n_predict": "many"}, "n_predict"),
    ({"prompt": ["a", "b"], "stream": True}, "stream false"),
    ({"prompt": []}, "prompt"),
])
def test_completion_refuses_bad_bodies_with_400(h, body, words):
    r = h.post("/completion", json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_tokenize_with_pieces(h):
    content = "This is a test 媽 and 🤗"
    plain = h.post("/tokenize", json={"content": content}).json()["tokens"]
    pieces = h.post("/tokenize", json={"content": content, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined.decode() == content   # a piece that is not whole UTF-8 comes as its bytes


def test_apply_template_is_the_rendered_chat_prompt(h):
    from ggflow.api import default_model_path
    from ggflow.core.chat_template import ChatTemplate

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = h.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt == ChatTemplate.from_gguf_file(default_model_path()).render(messages)
    assert "Be brief." in prompt and prompt.rstrip().endswith("assistant")
    assert h.post("/apply-template", json={"messages": "hi"}).status_code == 400


def test_props_get_and_post(h):
    props = h.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 256 and props["total_slots"] == 2
    assert "params" in props["default_generation_settings"]
    assert h.post("/props", json={}).json() == {"success": True}
    r = h.post("/props", json={"n_ctx": 5})
    assert r.status_code == 400 and "read-only" in r.json()["error"]["message"]
    assert h.post("/props", content=b"[1").status_code == 400


def test_infill_refused_when_the_vocabulary_has_no_fim_tokens(h):
    r = h.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert r.status_code == 501
    assert "Infill is not supported by this model" in r.json()["error"]["message"]


def test_infill_prompt_layout_as_llama_server():
    """format_prompt_infill's layout on a vocabulary with FIM tokens (a stand-in vocabulary: the default
    model has none): extra chunks, then FIM_PRE prefix prompt FIM_SUF suffix FIM_MID."""
    from types import SimpleNamespace

    from ggflow.serving.llama_routes import InfillBody, infill_tokens

    words = {}

    def tokenize(text, add_special=False, parse_special=False):
        return [words.setdefault(w, 100 + len(words)) for w in text.split()]

    special = SimpleNamespace(fim_pre=1, fim_suf=2, fim_mid=3, fim_rep=4, fim_sep=5)
    vocab = SimpleNamespace(special=special, tokenize=tokenize, add_bos=False, bos_id=None)
    body = InfillBody(input_prefix="a b c", input_suffix="x y", prompt="p",
                      input_extra=[{"filename": "f.py", "text": "e1 e2"}])
    got = infill_tokens(vocab, body, n_batch=32, n_ctx=256)
    t = lambda s: tokenize(s)  # noqa: E731
    assert got == [4, *t("myproject"), 5, *t("f.py"), *t("e1 e2"), 5, *t("filename"),
                   1, *t("a b c"), *t("p"), 2, *t("x y"), 3]
    short = infill_tokens(vocab, body.model_copy(update={"input_prefix": "a " * 40}), n_batch=16, n_ctx=256)
    assert short[short.index(1) + 1:short.index(2)] == t("a") * 12 + t("p")   # the prefix keeps 3/4 of a batch


def test_chat_template_file_replaces_the_models_template(tmp_path):
    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState
    from ggflow.serving.engine import Engine
    from tests.test_serving_http import serving

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    engine = Engine.load(default_model_path(), n_ctx=64, n_slots=1, n_threads=1)
    engine.start()
    state = ServerState(model_name="smollm2", engine=engine, chat_template_file=str(template))
    with serving(state) as url, httpx.Client(base_url=url, timeout=TIMEOUT_S) as h:
        r = h.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]})
        assert r.json() == {"prompt": "<user>Hi<assistant>"}


def test_native_logit_bias_forms_ban_the_greedy_token(h):
    first = _native(h, prompt=PROMPT, n_predict=1, temperature=0, return_tokens=True)
    token = first["tokens"][0]
    text = h.post("/detokenize", json={"tokens": [token]}).json()["content"]
    for bias in ([[token, False]], {str(token): -100}, [[token, -100]]):
        other = _native(h, prompt=PROMPT, n_predict=1, temperature=0, return_tokens=True, logit_bias=bias)
        assert other["tokens"][0] != token, bias
    as_text = _native(h, prompt=PROMPT, n_predict=1, temperature=0, return_tokens=True, logit_bias={text: False})
    assert as_text["tokens"][0] != token
    for bad in ([[1]], {"x": "y"}, [[10 ** 9, -1]], 5):
        assert h.post("/completion", json={"prompt": PROMPT, "logit_bias": bad}).status_code == 400


def test_ignore_eos_shows_in_generation_settings(h):
    """llama.cpp's test_ignore_eos: the end-of-generation tokens get a -inf bias, reported as null."""
    eog = _native(h, prompt=PROMPT, n_predict=2, ignore_eos=True)["generation_settings"]["logit_bias"]
    assert eog and all(e["bias"] is None for e in eog)
    eos = h.post("/tokenize", json={"content": "<|im_end|>", "parse_special": True}).json()["tokens"]
    assert eos[0] in [e["token"] for e in eog]
    assert _native(h, prompt=PROMPT, n_predict=2)["generation_settings"]["logit_bias"] == []
