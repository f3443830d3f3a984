"""The server under load, for a minute: benchmarks/soak_server.py with 8 clients on 4 slots (streams, plain
requests, cancels, disconnects, embeddings, grammar and tool requests; greedy replies compared with their solo
runs). The 10-minute run with 32 clients is the benchmark itself; docs/reliability.md has its figures."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")
pytest.importorskip("prometheus_client", reason="the soak reads /metrics as Prometheus text")

SOAK_SECONDS = 50   # and ~10 s to start the server and drain the clients


def load_soak():
    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "soak_server.py"
    spec = importlib.util.spec_from_file_location("soak_server", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_a_minute_of_streams_cancels_and_disconnects_leaves_the_server_clean(tmp_path):
    soak = load_soak()
    report = soak.run(clients=8, seconds=SOAK_SECONDS, slots=4, ctx=2048, threads=1, seed=16, warmup_s=12,
                      replays=30, rss_tolerance=0.05,   # the 2 % is for 10 minutes, not 50 s on a busy machine
                      log_path=str(tmp_path / "serve.log"))
    print(report.summary())
    t = report.tally
    assert not report.problems(), report.summary()
    # the checks had something to check: every kind of client ran, and tokens flowed
    assert min(t.requests[k] for k in ("complete", "plain", "cancel", "disconnect", "embed", "grammar", "tool")) > 0, \
        t.requests
    assert t.tokens_received > 0 and t.statuses[200] == sum(t.requests[k] for k in ("complete", "plain", "embed",
                                                                                  "grammar", "tool"))
    assert report.replayed > 0   # greedy replies were compared with their solo runs
    assert all(status < 500 for status in t.statuses)
