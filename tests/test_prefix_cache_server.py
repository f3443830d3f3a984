"""``ggflow serve -np 2`` reuses a prefix another slot computed: usage.prompt_tokens_details.cached_tokens,
timings.cache_n and /metrics' prompt_tokens_shared say so, and the greedy text is the one computed cold."""
from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi", reason="ggflow serve's app is FastAPI (the server extra)")
pytest.importorskip("uvicorn", reason="ggflow serve runs on uvicorn (the server extra)")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ggflow.api import default_model_path  # noqa: E402
from ggflow.serving.app import ServerState  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from tests.fixtures.default_model import needs_model  # noqa: E402
from tests.test_serving_http import serving  # noqa: E402

pytestmark = needs_model
SYSTEM = ("You are the help desk of a library. You answer questions about opening hours, borrowing books, "
          "late fees and the reading rooms, briefly and kindly. ") * 3
TIMEOUT_S = 300


def complete(url: str, prompt: str) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0},
                   timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def shared_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    for family in text_string_to_metric_families(text):
        if family.name == "llamacpp:prompt_tokens_shared":
            return family.samples[0].value
    raise AssertionError("no llamacpp:prompt_tokens_shared_total in /metrics")


@pytest.fixture(scope="module")
def url():
    engine = Engine.load(default_model_path(), n_ctx=1024, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", engine=engine)) as u:
        yield u


def test_a_second_slot_reuses_the_prefix_the_first_computed(url):
    q0, q1 = SYSTEM + "Q: When do you open? A:", SYSTEM + "Q: How long can I keep a book? A:"
    cold = complete(url, q1)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and cold["timings"]["cache_n"] == 0
    for slot in (0, 1):
        assert httpx.post(f"{url}/slots/{slot}", params={"action": "erase"}, timeout=TIMEOUT_S).status_code == 200
    before = shared_total(url)
    complete(url, q0)                        # one slot computes the system prompt
    warm = complete(url, q1)                 # the other starts from its cells (q0's slot keeps its own tokens)
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == warm["timings"]["cache_n"] > 0.9 * (warm["usage"]["prompt_tokens"] - 12)
    assert warm["timings"]["prompt_n"] == warm["usage"]["prompt_tokens"] - cached
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    assert shared_total(url) - before == cached
    slots = httpx.get(f"{url}/slots", timeout=TIMEOUT_S).json()
    assert all(s["n_cached"] > cached for s in slots)      # both slots hold the system prompt
