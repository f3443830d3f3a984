"""Nothing heavy on the event loop (issue 45 item 1): while clients send large /tokenize bodies, the loop
still answers at once, because parsing and tokenizing run in the worker pool (serving/offload.py) and the
tokenizer lets go of the GIL on long text (Vocab's encode_batch).

The measure is relative, so a loaded machine does not make it flaky: /health's slowest answer during the
load against the time one large /tokenize takes alone (the old code answered /health only after it).
"""
from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")

from ggflow.api import default_model_path  # noqa: E402
from ggflow.serving.app import ServerState  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from ggflow.serving.limits import ServerLimits  # noqa: E402
from tests.fixtures.default_model import needs_model  # noqa: E402
from tests.test_serving_http import serving  # noqa: E402

pytestmark = needs_model
CONTENT = "word salad " * 40000          # 440 KB of text: a second or more of tokenizing on one core


@pytest.fixture(scope="module")
def server():
    engine = Engine.load(default_model_path(), n_ctx=256, n_slots=1, n_threads=1)
    engine.start()
    limits = ServerLimits(max_body_bytes=32 << 20)   # room for the larger bodies a fast machine needs
    with serving(ServerState(model_name="smollm2", engine=engine, limits=limits)) as url:
        yield url


def tokenize(url: str, content: str = CONTENT) -> float:
    t0 = time.perf_counter()
    r = httpx.post(url + "/tokenize", content=json.dumps({"content": content}).encode(), timeout=300)
    assert r.status_code == 200 and len(r.json()["tokens"]) > 40000
    return time.perf_counter() - t0


def test_the_loop_answers_while_large_bodies_are_tokenized(server):
    content = CONTENT
    alone = tokenize(server, content)
    while alone < 0.3 and len(content) < 16 * len(CONTENT):   # a fast machine: a larger body, to have a measure
        content *= 2
        alone = tokenize(server, content)
    assert alone > 0.3, "the body is too small to measure anything on this machine"
    clients = [threading.Thread(target=lambda: [tokenize(server, content) for _ in range(2)]) for _ in range(2)]
    for c in clients:
        c.start()
    waits: list[float] = []
    with httpx.Client(base_url=server, timeout=60) as h:
        time.sleep(0.05)
        while any(c.is_alive() for c in clients):
            t0 = time.perf_counter()
            assert h.get("/health").status_code == 200
            waits.append(time.perf_counter() - t0)
            time.sleep(0.02)
    for c in clients:
        c.join()
    assert len(waits) >= 5
    # the old code answered a poll only between two tokenizations: half of them waited ~alone / 2 or more;
    # the slowest poll allows for a loaded machine's scheduling (the GIL passes every few ms)
    assert statistics.median(waits) < 0.1 * alone and max(waits) < 0.5 * alone, (sorted(waits)[-5:], alone)


def test_dry_compiles_where_its_sampler_is_built_not_in_the_engine_step():
    """In a fresh process: building a DRY sampler (what Engine.submit does, off the loop) leaves its kernel
    compiled, so the first engine step that applies it does not stall every slot while numba compiles."""
    import subprocess
    import sys

    code = ("from ggflow.samplers_builtin.penalties import Dry, dry_continuations\n"
            "assert not dry_continuations.signatures\n"
            "Dry(multiplier=0.8, sequence_breakers=[[5], [6, 7]])\n"
            "print(len(dry_continuations.signatures))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1"
