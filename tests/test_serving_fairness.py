"""Fairness in the engine (issue 44 item 1): embeddings and long prompts are evaluated in bounded pieces between
the generating slots' rows, and neither changes what greedy generation or the embedding gives.

The checks read the decodes the engine makes (a wrapper around the Context's ``decode`` records each batch),
not wall-clock gaps, so they hold on a busy machine; benchmarks/bench_fairness.py measures the gaps.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from ggflow.generation.step_budget import FIRST_TOKENS, StepBudget
from tests.test_serving_http import SERVED, client, erase_all, server, wait_idle  # noqa: F401  (module-scoped)

STREAM_PROMPT = "Once upon a time"
STREAM_TOKENS = 80


@pytest.fixture()
def decodes(server):
    """[(embeddings?, n_tokens, {seq_id: n_tokens})] of every decode while the test runs."""
    ctx = SERVED["engine"].ctx
    log, original = [], ctx.decode

    def recording(batch):
        seqs, counts = np.unique(batch.seq_id, return_counts=True)
        log.append((ctx.embeddings, batch.n_tokens, dict(zip(seqs.tolist(), counts.tolist()))))
        return original(batch)
    ctx.decode = recording
    yield log
    del ctx.decode


def server_of(client) -> str:
    return str(client.base_url).rstrip("/").removesuffix("/v1")


def stream_text(client, started: threading.Event | None = None) -> str:
    """The greedy stream's text, from an empty cache (as test_serving_http's concurrent streams: a run that
    starts from another cache state is not compared)."""
    if started is None:
        erase_all(server_of(client))
    stream = client.completions.create(model="smollm2", prompt=STREAM_PROMPT, max_tokens=STREAM_TOKENS,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    parts = []
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            if started is not None:
                started.set()
    return "".join(parts)


def while_streaming(client, work):
    """Run ``work()`` once a greedy stream has its first token; (the stream's text, work's result)."""
    erase_all(server_of(client))
    started, out = threading.Event(), {}
    thread = threading.Thread(target=lambda: out.setdefault("text", stream_text(client, started)))
    thread.start()
    assert started.wait(120), "the stream sent nothing"
    result = work()
    thread.join(300)
    return out["text"], result


def long_inputs(n: int, words: int) -> list[str]:
    return [" ".join(f"word{i}x{j}" for j in range(words)) for i in range(n)]


def test_an_embedding_request_is_evaluated_in_pieces_between_the_streams_tokens(server, client, decodes):
    wait_idle(server)
    inputs = long_inputs(3, 100)
    solo_text = stream_text(client)
    solo_vectors = [d.embedding for d in client.embeddings.create(model="smollm2", input=inputs,
                                                                  encoding_format="float").data]
    decodes.clear()
    text, vectors = while_streaming(client, lambda: [d.embedding for d in client.embeddings.create(
        model="smollm2", input=inputs, encoding_format="float").data])
    assert text == solo_text                          # greedy: as alone
    # the same states pooled the same way; the input's cells may lie elsewhere in the shared cache than they did
    # alone, and the attention sums in cell order (float32 rounding: test_serving_slots_state.EMBED_ATOL)
    np.testing.assert_allclose(vectors, solo_vectors, rtol=0, atol=1e-3)
    pieces = [i for i, (emb, _, _) in enumerate(decodes) if emb]
    between = [d for d in decodes[pieces[0]:pieces[-1]] if not d[0]]
    # old code: the whole request in one engine call, its decodes back to back with no stream row between
    # (the stream may end first: the pieces after it run back to back)
    assert len(pieces) >= 3 and len(between) >= min(len(pieces) - 1, 10), (len(pieces), len(between))
    n_batch = SERVED["engine"].n_batch
    assert max(n for emb, n, _ in decodes if emb) < n_batch


def test_a_long_prompt_is_chunked_small_while_a_slot_generates(server, client, decodes):
    wait_idle(server)
    prompt = " ".join(long_inputs(1, 150))
    solo_text = stream_text(client)
    solo_long = client.completions.create(model="smollm2", prompt=prompt, max_tokens=4, temperature=0)
    wait_idle(server)
    for slot in SERVED["engine"].slots:   # the long prompt is evaluated again, not reused from the cache
        SERVED["engine"].erase_slot(slot.id).result(30)
    decodes.clear()
    text, long = while_streaming(client, lambda: client.completions.create(model="smollm2", prompt=prompt,
                                                                         max_tokens=4, temperature=0))
    assert text == solo_text and long.choices[0].text == solo_long.choices[0].text
    n_prompt = long.usage.prompt_tokens
    # decodes holding a generating row (one token of a sequence) and a prompt chunk of another
    mixed = [max(counts.values()) for emb, n, counts in decodes
             if not emb and len(counts) >= 2 and min(counts.values()) == 1 and max(counts.values()) > 1]
    # old code: the prompt in n_batch - 1 tokens and the rest (two mixed decodes, one of 511 tokens)
    assert mixed and max(mixed) <= SERVED["engine"].n_batch // 2, mixed
    assert sum(mixed) >= n_prompt // 2


def test_the_step_budget_follows_the_measured_times():
    budget = StepBudget(512, latency_factor=2.0, min_tokens=8)
    assert budget.extra_tokens(0) == 512            # nothing generates: the whole batch
    assert budget.extra_tokens(3) == FIRST_TOKENS   # nothing measured yet
    budget.observe(3, 0, 0.010)                     # rows alone: 10 ms
    budget.observe(3, 32, 0.010 + 32 * 0.0005)      # each extra token: 0.5 ms
    assert budget.extra_tokens(3) == 16             # (2 - 1) * 10 ms / 0.5 ms = 20, rounded down to 16
    assert budget.side_tokens(3, 0) == 8 and budget.side_tokens(3, 16) == 8   # half; at least min_tokens
    assert budget.side_tokens(0, 100) == 412        # nothing generates: the rest of n_batch
    for _ in range(50):                             # a backend where a token costs next to nothing
        budget.observe(3, 32, 0.010)
    assert budget.extra_tokens(3) == 509            # all of n_batch but the rows
    for _ in range(50):                             # a slow machine: the least the budget gives
        budget.observe(3, 16, 0.5)
    assert budget.extra_tokens(3) == 8


def test_embedding_requests_at_once_take_turns_each_on_its_own_sequence(server, client):
    """Pieces of several requests interleave (round robin): each input needs a spare sequence of its own."""
    wait_idle(server)
    inputs = long_inputs(3, 40)
    solo = [client.embeddings.create(model="smollm2", input=t, encoding_format="float").data[0].embedding
            for t in inputs]
    out: dict = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, client.embeddings.create(
        model="smollm2", input=inputs[i], encoding_format="float").data[0].embedding)) for i in range(3)]
    text, _ = while_streaming(client, lambda: [t.start() for t in threads] and [t.join(120) for t in threads])
    assert text == stream_text(client)
    np.testing.assert_allclose([out[i] for i in range(3)], solo, rtol=0, atol=1e-3)
