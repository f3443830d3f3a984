"""LoRA adapters in the server: requests with different adapter mixes decode in one batch, each token for token
(and logprob for logprob) its solo run; llama-server's /lora-adapters routes and per-request ``lora``; refusals.

The model and adapters are tests/lora_reference.py's (llama.cpp's converters on a tiny random llama and random
peft adapters); their logits against peft are tests/test_lora.py's.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.context import Context
from ggflow.core.lora import load_lora
from ggflow.core.model import Model
from ggflow.core.sampling import SamplingParams
from ggflow.generation.engine import Engine
from ggflow.generation.request import Done, Request
from ggflow.errors import GGFlowError
from tests.lora_reference import build_lora_pair

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[1, 17, 200, 33, 99], [1, 400, 5, 311, 42, 7, 8], [1, 250, 251], [1, 60, 61, 62, 63]]
MIXES = [{0: 1.0}, {1: 0.7}, {0: 0.5, 1: -1.5}, None]   # None: the default mix, the adapters at 0 below


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_lora_pair(tmp_path_factory.mktemp("lora-serving"), n_adapters=2)


@pytest.fixture(scope="module")
def engine(pair):
    model = Model.load(pair.base)
    ctx = Context(model, n_ctx=512, backends="cpu", n_threads=1)
    ctx.set_lora([load_lora(p, model) for p in pair.adapters], [0.0, 0.0])
    return Engine(ctx, n_slots=4, max_queue=8)


def _request(prompt, mix, done):
    return Request(prompt, lambda e: done.append(e) if isinstance(e, Done) else None, max_tokens=10,
                   sampling=GREEDY, n_top=2, lora=mix)


def _run(engine, items):
    """Submit (prompt, mix) requests together, step until idle: each one's (tokens, logprobs)."""
    engine.clear_cache()
    outs = [[] for _ in items]
    for (prompt, mix), out in zip(items, outs):
        engine.submit(_request(prompt, mix, out))
    engine.run_until_idle(timeout=300)
    results = []
    for out in outs:
        (done,) = out
        assert done.error is None, done.error
        c = done.completion
        results.append((c.tokens, [(lp.logprob, lp.top) for lp in c.logprobs]))
    return results


def test_different_adapters_in_one_batch_match_their_solo_runs(engine):
    solo = [_run(engine, [item])[0] for item in zip(PROMPTS, MIXES)]
    assert len({tuple(tokens) for tokens, _ in solo}) == len(solo)
    # the adapters change what is generated: the same prompt under each mix
    same_prompt = [_run(engine, [(PROMPTS[0], mix)])[0][0] for mix in MIXES]
    assert len({tuple(t) for t in same_prompt}) == len(MIXES)

    graphs_with_adapters = []
    decode = engine.ctx.decode

    def spy(batch):
        mixes = {tuple(engine.ctx.lora.seq_scales[s]) for s in np.unique(batch.seq_id)}
        graphs_with_adapters.append(len(mixes))
        return decode(batch)
    engine.ctx.decode = spy
    try:
        together = _run(engine, list(zip(PROMPTS, MIXES)))
    finally:
        del engine.ctx.decode
    assert max(graphs_with_adapters) == len(MIXES)   # one batch carried all four mixes
    for (tokens, logprobs), (solo_tokens, solo_logprobs) in zip(together, solo):
        assert tokens == solo_tokens
        assert logprobs == solo_logprobs            # bit for bit


def test_a_cached_prefix_is_not_reused_under_another_mix(engine):
    first = _run(engine, [(PROMPTS[1], {0: 1.0})])[0]
    # the same prompt again, no cache clear in between: with the other adapter the prefix must be evaluated again
    out: list = []
    engine.submit(_request(PROMPTS[1], {1: 1.0}, out))
    engine.run_until_idle(timeout=300)
    assert out[0].completion.timings.cached_n == 0
    assert out[0].completion.tokens != first[0]
    out2: list = []
    engine.submit(_request(PROMPTS[1], {1: 1.0}, out2))   # same mix: the prefix is reused
    engine.run_until_idle(timeout=300)
    assert out2[0].completion.timings.cached_n > 0
    assert out2[0].completion.tokens == out[0].completion.tokens


def test_unknown_adapter_id_is_refused(engine):
    with pytest.raises(GGFlowError, match="adapter id in \\[0, 2\\)"):
        engine.submit(_request(PROMPTS[0], {2: 1.0}, []))
    with pytest.raises(GGFlowError, match="finite"):
        engine.submit(_request(PROMPTS[0], {0: float("inf")}, []))


# -- over HTTP ----------------------------------------------------------------------------------------
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")


@pytest.fixture(scope="module")
def server(pair):
    from ggflow.serving.app import ServerState
    from ggflow.serving.lora import load_adapters
    from tests.test_serving_http import serving

    engine = Engine.load(str(pair.base), n_ctx=512, n_slots=2, n_threads=1, backends="cpu")
    load_adapters(engine.ctx, [(str(p), 0.0) for p in pair.adapters])
    engine.start()
    with serving(ServerState(model_name="tiny", engine=engine)) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


def _complete(server, **extra):
    r = server.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_lora_adapters_lists_them_in_llama_server_shape(server, pair):
    assert server.get("/lora-adapters").json() == [{"id": i, "path": str(p), "scale": 0.0}
                                                   for i, p in enumerate(pair.adapters)]


def test_post_lora_adapters_sets_the_default_mix_without_reloading(server):
    base = _complete(server)
    with_first = _complete(server, lora=[{"id": 0, "scale": 1.0}])
    assert with_first != base
    r = server.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 200 and r.json() == {"success": True}
    assert [a["scale"] for a in server.get("/lora-adapters").json()] == [1.0, 0.0]
    assert _complete(server) == with_first                  # no lora field: the default mix
    assert _complete(server, lora=[]) == base               # an empty list: every adapter at 0
    r = server.post("/lora-adapters", json=[])               # left out: 0, as llama-server
    assert [a["scale"] for a in server.get("/lora-adapters").json()] == [0.0, 0.0]
    assert _complete(server) == base


@pytest.mark.parametrize("body", [{"id": 0, "scale": 1}, [{"id": 2, "scale": 1.0}], [{"id": 0}],
                                  [{"id": "0", "scale": 1.0}], [{"id": 0, "scale": "1"}], '[{"id": 0, "scale": 1e999}]',
                                  [{"id": 0, "scale": 1.0}, {"id": 0, "scale": 2.0}], "[", '[{"id": 0, "scale": NaN}]', [[0, 1.0]]])
def test_post_lora_adapters_refuses_bad_bodies(server, body):
    before = server.get("/lora-adapters").json()
    r = server.post("/lora-adapters", content=body if isinstance(body, str) else None,
                    json=None if isinstance(body, str) else body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert server.get("/lora-adapters").json() == before


@pytest.mark.parametrize("lora", [[{"id": 7, "scale": 1.0}], {"id": 0, "scale": 1.0}, [{"id": 0, "scale": None}],
                                  [{"id": -1, "scale": 1.0}], [{"id": 0, "scale": 1.0, "extra": 1}]])
def test_a_request_with_a_bad_lora_field_is_a_400(server, lora):
    r = server.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 2, "lora": lora})
    assert r.status_code == 400, r.text
    r = server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                  "lora": lora})
    assert r.status_code == 400, r.text


def test_serve_flags_keep_command_line_order():
    from ggflow.cli import build_parser
    from ggflow.cli.args import UsageError

    args = build_parser().parse_args(["serve", "--lora", "a.gguf", "--lora-scaled", "b.gguf", "0.5", "--lora", "c.gguf"])
    assert args.lora_adapters == [("a.gguf", 1.0), ("b.gguf", 0.5), ("c.gguf", 1.0)]
    with pytest.raises(UsageError, match="the scale must be a finite number"):
        build_parser().parse_args(["serve", "--lora-scaled", "b.gguf", "nan"])


def test_embeddings_follow_the_default_mix(server):
    def embed():
        r = server.post("/v1/embeddings", json={"input": "hello there"})
        assert r.status_code == 200, r.text
        return np.array(r.json()["data"][0]["embedding"])
    base = embed()
    assert server.post("/lora-adapters", json=[{"id": 1, "scale": 1.0}]).status_code == 200
    try:
        assert np.abs(embed() - base).max() > 1e-3
    finally:
        assert server.post("/lora-adapters", json=[]).status_code == 200
    np.testing.assert_array_equal(embed(), base)


def test_serve_refuses_an_adapter_for_another_model_at_load(pair):
    import subprocess
    import sys

    from tests.data_dir import DATA
    from tests.test_serving_http import free_port

    other = DATA / "models" / "tiny-llama-hs-f32.gguf"
    run = subprocess.run([sys.executable, "-m", "ggflow.cli", "serve", "-m", str(other), "--lora",
                          str(pair.adapters[0]), "--port", str(free_port()), "-t", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "does not match the base model" in run.stderr and "an adapter for another model?" in run.stderr
