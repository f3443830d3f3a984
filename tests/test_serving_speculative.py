"""Speculative decoding behind ``ggflow serve``: the same text as without it, draft counts in the response's
timings (llama-server's ``draft_n`` / ``draft_n_accepted``) and in /metrics (``llamacpp:spec_decode_*``).

One server on the default model; its engine's drafter is switched between requests (in the engine thread),
so plain and speculative answers come from the same process, KV cache and slots.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("openai", reason="the HTTP tests drive the server with the openai client")
pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
pytest.importorskip("prometheus_client", reason="/metrics renders through prometheus-client (the server extra)")
pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ggflow.api import default_model_path  # noqa: E402
from ggflow.generation.draft_model import load_draft_model  # noqa: E402
from ggflow.generation.speculative import CallableDrafter, LlamaPromptLookupDecoding  # noqa: E402
from ggflow.serving.app import ServerState  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from tests.data_dir import DATA  # noqa: E402
from tests.fixtures.default_model import needs_model  # noqa: E402
from tests.test_serving_http import API_KEY, http, serving  # noqa: E402
from tests.test_speculative import EDIT  # noqa: E402

pytestmark = needs_model
N_TOKENS = 32


@pytest.fixture(scope="module")
def served():
    engine = Engine.load(default_model_path(), n_ctx=1024, n_slots=2, n_threads=1)
    drafters = {"plain": None,
                "ngram": CallableDrafter(LlamaPromptLookupDecoding(num_pred_tokens=10), engine.vocab.n_vocab),
                "draft": load_draft_model(default_model_path(), engine.ctx, n_max=6, n_threads=1)}
    engine.start()
    with serving(ServerState(model_name="smollm2", api_key=API_KEY, engine=engine)) as url:
        yield url, engine, drafters


def use(served, name: str) -> None:
    url, engine, drafters = served
    engine.call_soon(lambda: setattr(engine, "drafter", drafters[name])).result(timeout=30)


def complete(served, **body) -> dict:
    with http(served[0]) as h:
        r = h.post("/v1/completions", json={"prompt": EDIT, "max_tokens": N_TOKENS, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    return {"content": choice["text"], "finish_reason": choice["finish_reason"],
            "tokens_predicted": out["usage"]["completion_tokens"], "timings": out["timings"]}


@pytest.mark.parametrize("kind", ["ngram", "draft"])
@pytest.mark.parametrize("body", [{}, {"stop": ["height)"]}, {"grammar": 'root ::= "def area(" [^\\x00]*'},
                                  {"temperature": 0.8, "seed": 99}],
                         ids=["greedy", "stop", "grammar", "seeded"])
def test_speculative_answers_equal_plain_ones(served, kind, body):
    use(served, "plain")
    plain = complete(served, **body)
    use(served, kind)
    spec = complete(served, **body)
    assert spec["content"] == plain["content"] and spec["finish_reason"] == plain["finish_reason"]
    assert spec["tokens_predicted"] == plain["tokens_predicted"]
    t = spec["timings"]
    assert t["draft_n"] >= t["draft_n_accepted"] > 0
    assert "draft_n" not in plain["timings"]


def test_openai_chat_route_gives_the_plain_answer_and_timings(served):
    import openai

    client = openai.OpenAI(base_url=f"{served[0]}/v1", api_key=API_KEY, timeout=120, max_retries=0)
    messages = [{"role": "user", "content": EDIT}]
    use(served, "plain")
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=N_TOKENS, temperature=0)
    use(served, "ngram")
    spec = client.chat.completions.create(model="m", messages=messages, max_tokens=N_TOKENS, temperature=0)
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert spec.model_extra["timings"]["draft_n"] > 0


def test_two_slots_speculate_side_by_side(served):
    from concurrent.futures import ThreadPoolExecutor

    use(served, "plain")
    bodies = [{}, {"prompt": EDIT.replace("width", "size")}]
    plain = [complete(served, **b)["content"] for b in bodies]
    use(served, "ngram")
    with ThreadPoolExecutor(2) as pool:
        spec = list(pool.map(lambda b: complete(served, **b), bodies))
    assert [s["content"] for s in spec] == plain


def test_metrics_count_drafts_and_acceptances(served):
    use(served, "ngram")
    before = _spec_metrics(served)
    t = complete(served)["timings"]
    after = _spec_metrics(served)
    drafted = "llamacpp:spec_decode_num_draft_tokens"
    assert after[drafted] - before[drafted] == t["draft_n"]
    assert (after["llamacpp:spec_decode_num_accepted_tokens"] - before["llamacpp:spec_decode_num_accepted_tokens"]
            == t["draft_n_accepted"])
    assert after["llamacpp:spec_decode_num_drafts"] > before["llamacpp:spec_decode_num_drafts"]


def _spec_metrics(served) -> dict[str, float]:
    with http(served[0]) as h:
        text = h.get("/metrics").text
    return {m.name: m.samples[0].value for m in text_string_to_metric_families(text)
            if m.name.startswith("llamacpp:spec_decode")}


# -- the command line refuses bad speculative options before loading anything -------------------------
@pytest.mark.parametrize("argv,expected", [
    (["--draft-max", "0"], "--draft-max"), (["--draft-max", "5000"], "[1, 1024]"),
    (["--draft-p-min", "1.5"], "--draft-p-min"), (["--spec-type", "draft-simple"], "needs a draft model"),
    (["-md", "/no/such/draft.gguf"], "no such file"), (["--spec-type", "bogus"], "invalid choice"),
    (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "2000"], "--spec-ngram-simple-size-m"),
    (["--spec-type", "ngram", "--ray"], "--ray"),
])
def test_serve_refuses_bad_speculative_options(argv, expected, capsys):
    from ggflow.cli import main

    assert main(["serve", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_serve_with_an_incompatible_draft_model_exits_naming_both_models(tmp_path):
    target, draft = DATA / "models" / "tiny-gpt2-hs-f32.gguf", DATA / "models" / "tiny-qwen2-hs-q8_0.gguf"
    proc = subprocess.run([sys.executable, "-m", "ggflow.cli", "serve", "-m", str(target), "-md", str(draft),
                           "--port", "0", "-c", "64", "-np", "1", "-t", "1"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "tiny-gpt2-hs-f32.gguf" in proc.stderr and "tiny-qwen2-hs-q8_0.gguf" in proc.stderr
    assert "token 511" in proc.stderr


@pytest.mark.parametrize("argv,kind,n_max", [
    ([], None, None), (["--spec-type", "ngram", "--draft-max", "7", "--spec-ngram-size-n", "3"], "ngram", 7),
    (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "9"],
     "ngram-simple", 9),
    (["-md", str(DATA / "models" / "tiny-llama-hs-q4_0.gguf"), "--draft-max", "5", "--draft-min", "2",
      "--draft-p-min", "0.25"], "draft-simple", 5),
])
def test_serve_options_make_the_drafter_they_name(argv, kind, n_max):
    import argparse

    from ggflow.cli.serve_cmd import add_parser
    from ggflow.cli.speculative_args import drafter_from_args
    from ggflow.core.context import Context
    from ggflow.core.model import Model
    from ggflow.generation.draft_model import DraftModelDrafter
    from ggflow.generation.speculative import NgramSimple

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "-t", "1", *argv])
    drafter = drafter_from_args(args, Context(Model.load(str(DATA / "models" / "tiny-llama-hs-q8_0.gguf")),
                                              n_ctx=64, n_threads=1))
    if kind is None:
        assert drafter is None
    elif kind == "ngram":
        assert (drafter.fn.num_pred_tokens, drafter.fn.max_ngram_size) == (n_max, 3)
    elif kind == "ngram-simple":
        assert isinstance(drafter.fn, NgramSimple) and (drafter.fn.size_n, drafter.fn.size_m) == (4, n_max)
    else:
        assert isinstance(drafter, DraftModelDrafter)
        assert (drafter.n_max, drafter.n_min, drafter.p_min, drafter.ctx.n_ctx) == (n_max, 2, 0.25, 64)
