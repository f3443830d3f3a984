"""A plugin sampler declares its parameters once; SamplingParams, the CLI (--samplers "name:param=value",
--sampler-param) and the server (a request's ``samplers``) build it from that declaration and check values
the same way; an unknown name is one line (a 400 in the server) listing what is registered."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ggflow.core.sampling import SamplerBase, make_sampler
from ggflow.core.sampling_params import SamplingParams, build_chain
from ggflow.core.sampling_stages import SamplerParam, describe_params, parse_samplers, with_sampler_params
from ggflow.errors import ArgumentError, UnknownNameError
from ggflow.plugins import hookimpl
from ggflow.plugins.manager import get_plugin_manager
from tests.fixtures.default_model import needs_model


class AcmeRank(SamplerBase):
    """A third party's selecting sampler: picks the candidate ranked ``rank`` by logit (0: greedy)."""

    name = "acme_rank"
    selects = True
    params = (SamplerParam("rank", int, 0, lo=0, hi=1000, doc="which candidate, by logit, to pick"),
              SamplerParam("floor", float, -np.inf, doc="logits below it never count"))

    def __init__(self, rank: int, floor: float):
        self.rank, self.floor = rank, floor

    def apply(self, cur):
        order = np.argsort(-cur.logits, kind="stable")
        cur.selected = int(order[min(self.rank, len(order) - 1)])


class Plugin:
    @hookimpl
    def register_samplers(self, register):
        register(AcmeRank)


@pytest.fixture
def acme():
    manager, plugin = get_plugin_manager(), Plugin()
    manager.register(plugin, "acme-rank-test")
    yield
    manager.unregister(plugin)


LOGITS = np.array([0.5, 3.0, 1.0, 2.0], dtype=np.float32)   # ranks: 1, 3, 2, 0


def test_the_declaration_builds_the_sampler_with_its_defaults_and_checked_values(acme):
    assert make_sampler("acme_rank").rank == 0 and make_sampler("acme_rank").floor == -np.inf
    assert make_sampler("acme_rank", rank="2").rank == 2          # text, as a command line gives it
    # LOGITS by rank: tokens 1, 3, 2, 0
    for entry, token in (("acme_rank:rank=2", 2), (("acme_rank", {"rank": 1}), 3),
                         ({"name": "acme_rank", "rank": 3}, 0), ("acme_rank", 1)):
        assert build_chain(SamplingParams(samplers=[entry])).sample(LOGITS) == token


@pytest.mark.parametrize("entry, message", [
    ("acme_rank:rank=-1", "acme_rank.rank=-1 is not accepted: acme_rank.rank must be an integer in [0, 1000]"),
    ("acme_rank:rank=two", "acme_rank.rank='two' is not accepted"),
    (("acme_rank", {"rank": 1.5}), "must be an integer in [0, 1000]"),
    (("acme_rank", {"rank": True}), "must be an integer"),
    ("acme_rank:rnak=1", "one of the parameters acme_rank takes: rank (an integer in [0, 1000]), floor (a number)"),
    ("acme_rank:rank", "name:param=value"),
    (("top_k", {"k": "many"}), "top_k.k='many' is not accepted: top_k.k must be an integer"),   # from __init__
])
def test_a_bad_parameter_is_an_argument_error_saying_what_is_accepted(acme, entry, message):
    with pytest.raises(ArgumentError) as info:
        SamplingParams(samplers=["top_k", entry])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_sampler_is_one_line_listing_the_registered_ones(acme):
    with pytest.raises(UnknownNameError) as info:
        SamplingParams(samplers=["top_k", "acme_rnak:rank=1"])
    text = str(info.value)
    assert text.startswith("unknown sampler 'acme_rnak'; registered: ") and "acme_rank" in text
    assert "top_k" in text and "\n" not in text


def test_cli_text_parses_into_stages_and_sampler_param_sets_one(acme):
    assert parse_samplers("top_k;acme_rank:rank=1,floor=-5;temperature") == [
        "top_k", ("acme_rank", {"rank": "1", "floor": "-5"}), "temperature"]
    stages = with_sampler_params(["top_k", "acme_rank"], ["acme_rank.rank=2", "top_k.k=7"])
    assert stages == [("top_k", {"k": 7}), ("acme_rank", {"rank": 2})]
    with pytest.raises(ArgumentError, match="a parameter of a stage in the chain .top_k.; add acme_rank"):
        with_sampler_params(["top_k"], ["acme_rank.rank=2"])
    assert describe_params("acme_rank") == "rank: an integer in [0, 1000] = 0; floor: a number = -inf"


@needs_model
def test_the_cli_sets_a_plugin_samplers_parameter_and_it_changes_the_output(acme, capsys):
    from ggflow.cli import main

    def tokens(*flags: str) -> list[int]:
        assert main(["run", "--prompt-ids", "1,504,3", "-n", "4", "-c", "64", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out.splitlines()[-1])["tokens"]

    greedy = tokens("--temp", "0")
    assert tokens("--samplers", "acme_rank") == greedy
    second = tokens("--samplers", "acme_rank:rank=1")
    assert second != greedy
    assert tokens("--samplers", "top_k;acme_rank", "--sampler-param", "acme_rank.rank=1") == second
    assert main(["run", "--prompt-ids", "1,2", "-n", "1", "-c", "64", "--samplers", "acme_rnak"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown sampler 'acme_rnak'; registered: " in err[0] and "acme_rank" in err[0]


@needs_model
def test_a_server_request_sets_a_plugin_samplers_parameter_and_it_changes_the_output(acme):
    pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
    from fastapi.testclient import TestClient

    from ggflow.api import default_model_path
    from ggflow.serving.app import ServerState, create_app
    from ggflow.serving.engine import Engine

    engine = Engine.load(default_model_path(), n_ctx=256, n_slots=1, n_threads=1)
    engine.start()
    try:
        with TestClient(create_app(ServerState(model_name="m", engine=engine))) as h:
            def complete(**extra):
                r = h.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4,
                                                    "temperature": 0, **extra})
                return r.status_code, r.json()

            status, greedy = complete()
            assert status == 200
            assert complete(samplers=["acme_rank"])[1]["choices"][0]["text"] == greedy["choices"][0]["text"]
            status, ranked = complete(samplers=[{"name": "acme_rank", "rank": 1}])
            assert status == 200 and ranked["choices"][0]["text"] != greedy["choices"][0]["text"]
            assert complete(samplers="acme_rank:rank=1")[1]["choices"][0]["text"] == ranked["choices"][0]["text"]
            status, body = complete(samplers=["acme_rnak"])
            assert status == 400 and "unknown sampler 'acme_rnak'; registered: " in body["error"]["message"]
            status, body = complete(samplers=[{"name": "acme_rank", "rank": 5000}])
            assert status == 400 and "acme_rank.rank must be an integer in [0, 1000]" in body["error"]["message"]
    finally:
        engine.stop(drain=False, timeout=30)
