"""The serving engine without HTTP: many sequences per decode, prefix reuse, a full KV cache, the queue bound.

Greedy results are compared token for token: the CPU kernels are batch invariant, so a request decoded
together with others must produce exactly what it produces alone.
"""
from __future__ import annotations

import pytest

from ggflow.api import default_model_path
from ggflow.core.context import Context
from ggflow.core.model import Model
from ggflow.core.sampling import SamplingParams
from ggflow.serving import Done, Engine, Piece, PromptTooLongError, QueueFullError, Request
from ggflow.generation.batch import generate_many

GREEDY = SamplingParams(temperature=0)
PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,",
           "def fibonacci(n):", "Three primary colors are"]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def model():
    return Model.load(default_model_path())


@pytest.fixture(scope="module")
def engine(model):
    return Engine(Context(model, n_ctx=512, n_threads=1), n_slots=4)


def run(engine: Engine, prompts, max_tokens=12, sampling=GREEDY, **request_options):
    """Submit every prompt, step the engine until idle; the Done events in prompt order."""
    done: list[Done | None] = [None] * len(prompts)

    def sink(i):
        return lambda ev: done.__setitem__(i, ev) if isinstance(ev, Done) else None

    for i, p in enumerate(prompts):
        tokens = engine.vocab.tokenize(p) if isinstance(p, str) else p
        engine.submit(Request(tokens, sink(i), max_tokens=max_tokens, sampling=sampling, **request_options))
    engine.run_until_idle(TIMEOUT_S)
    assert all(d is not None and d.error is None for d in done), done
    return [d.completion for d in done]


def alone(engine: Engine, prompt, **options):
    engine.clear_cache()
    return run(engine, [prompt], **options)[0]


def test_batched_greedy_output_equals_alone(engine):
    solo = [alone(engine, p) for p in PROMPTS]
    engine.clear_cache()
    decodes0 = engine.metrics.snapshot()
    together = run(engine, PROMPTS)
    m = engine.metrics.snapshot()
    assert [c.tokens for c in together] == [c.tokens for c in solo]
    assert [c.text for c in together] == [c.text for c in solo]
    # they really shared decode calls: about one per generated token, not four
    busy = (m.n_busy_slots_total - decodes0.n_busy_slots_total) / (m.n_decode_total - decodes0.n_decode_total)
    assert busy > 3


def test_seeded_sampling_is_per_request(engine):
    """Each request has its own chain and RNG: a seeded request samples the same alone or batched."""
    params = SamplingParams(temperature=1.0, seed=1234)
    solo = alone(engine, PROMPTS[1], sampling=params, max_tokens=10)
    engine.clear_cache()
    together = run(engine, PROMPTS, sampling=params, max_tokens=10)
    assert together[1].tokens == solo.tokens


def test_prefix_reuse_evaluates_only_the_suffix(engine):
    vocab = engine.vocab
    head = vocab.tokenize("A long shared system prompt that several requests begin with, about the sea.")
    tail = vocab.tokenize(" Tell me about whales.", add_special=False)
    cold = alone(engine, head + tail)
    engine.clear_cache()
    run(engine, [head], max_tokens=1)         # leaves exactly `head` cached in one slot
    warm = run(engine, [head + tail])[0]
    assert warm.timings.cached_n == len(head)
    assert warm.timings.prompt_n == len(tail)
    assert warm.tokens == cold.tokens


def test_new_request_goes_to_the_slot_with_the_longest_shared_prefix(engine):
    engine.clear_cache()
    a, b = engine.vocab.tokenize(PROMPTS[0]), engine.vocab.tokenize(PROMPTS[1])
    run(engine, [a, b], max_tokens=1)
    slot_of_b = next(s for s in engine.slots if s.cache_tokens == b)
    events = []
    engine.submit(Request(b + a[1:], events.append, max_tokens=2, sampling=GREEDY))
    engine.step()
    assert slot_of_b.request is not None and slot_of_b.n_reused == len(b)
    engine.run_until_idle(TIMEOUT_S)


def test_full_kv_cache_finishes_the_largest_slot_and_spares_the_others(model):
    """A 64-cell cache: a long request and two short ones cannot all fit; the long one ends with "length"."""
    engine = Engine(Context(model, n_ctx=64, n_threads=1), n_slots=3)
    vocab = engine.vocab
    long_prompt = vocab.tokenize("word " * 39)[:40]
    short = [vocab.tokenize("Hello there"), vocab.tokenize("Paris is")]
    solo = [alone(engine, p, max_tokens=10) for p in short]
    engine.clear_cache()
    done: list = [None] * 3
    for i, (p, n) in enumerate([(long_prompt, 100), (short[0], 10), (short[1], 10)]):
        engine.submit(Request(p, lambda ev, i=i: done.__setitem__(i, ev) if isinstance(ev, Done) else None,
                              max_tokens=n, sampling=GREEDY))
    engine.run_until_idle(TIMEOUT_S)
    long_done, *short_done = [d.completion for d in done]
    assert long_done.finish_reason == "length" and len(long_done.tokens) < 20
    assert [c.tokens for c in short_done] == [c.tokens for c in solo]
    assert [c.finish_reason for c in short_done] == [c.finish_reason for c in solo]


def test_a_sequence_that_fills_the_context_finishes_with_length(model):
    engine = Engine(Context(model, n_ctx=32, n_threads=1), n_slots=1)
    c = run(engine, [engine.vocab.tokenize("word " * 20)], max_tokens=100)[0]
    assert c.finish_reason == "length"
    assert len(c.prompt_tokens) + len(c.tokens) == 32 + 1  # the last sampled token is never evaluated


def test_queue_bound_refuses_with_queue_full(engine):
    engine.clear_cache()
    bounded = Engine(engine.ctx, n_slots=1, max_queue=1)
    tokens = engine.vocab.tokenize(PROMPTS[0])
    events: list = []
    bounded.submit(Request(tokens, events.append, max_tokens=2, sampling=GREEDY))   # takes the slot
    bounded.submit(Request(tokens, events.append, max_tokens=2, sampling=GREEDY))   # waits
    with pytest.raises(QueueFullError):
        bounded.submit(Request(tokens, events.append, max_tokens=2, sampling=GREEDY))
    bounded.run_until_idle(TIMEOUT_S)
    bounded.clear_cache()
    assert sum(isinstance(e, Done) for e in events) == 2


def test_prompt_longer_than_the_context_is_refused_with_both_counts(engine):
    with pytest.raises(PromptTooLongError) as err:
        engine.submit(Request([1] * (engine.n_ctx + 1), lambda ev: None))
    assert (err.value.n_prompt_tokens, err.value.n_ctx) == (engine.n_ctx + 1, engine.n_ctx)


def test_cancelled_request_frees_its_slot_at_the_next_step(engine):
    engine.clear_cache()
    events: list = []
    request = Request(engine.vocab.tokenize(PROMPTS[1]), events.append, max_tokens=200, sampling=GREEDY)
    engine.submit(request)
    for _ in range(4):
        engine.step()
    assert any(s.request is request for s in engine.slots)
    request.cancel()
    engine.step()
    assert not any(s.is_busy for s in engine.slots)
    assert not any(isinstance(e, Done) for e in events)
    assert 0 < sum(isinstance(e, Piece) for e in events) < 10


def test_stop_string_ends_the_request_without_emitting_it(engine):
    free = alone(engine, PROMPTS[2], max_tokens=24)
    cut = free.text.index("\n", 1)
    stop = free.text[cut:cut + 3]
    stopped = alone(engine, PROMPTS[2], max_tokens=24, stop=[stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[:free.text.index(stop)]


def test_generate_many_returns_completions_in_order_as_alone(model, engine):
    solo = [alone(engine, p, max_tokens=8) for p in PROMPTS[:3]]
    many = generate_many(model, PROMPTS[:3], max_tokens=8, n_slots=2, temperature=0, n_ctx=256, n_threads=1)
    assert [c.tokens for c in many] == [c.tokens for c in solo]


def test_batched_greedy_output_equals_alone_after_prefix_reuse(engine):
    solo = [alone(engine, p, max_tokens=24) for p in PROMPTS]
    engine.clear_cache()
    for p in PROMPTS:                       # each prompt cached in its own slot, one after another
        run(engine, [p], max_tokens=24)
    together = run(engine, PROMPTS, max_tokens=24)
    assert all(c.timings.cached_n > 0 for c in together)
    assert [c.tokens for c in together] == [c.tokens for c in solo]


def test_generate_many_on_an_llm_leaves_its_own_cache_alone():
    from ggflow.api import LLM

    llm = LLM(n_ctx=512, n_threads=1)
    first = llm.generate(PROMPTS[0], 6, temperature=0)
    many = llm.generate_many(PROMPTS[1:3], max_tokens=6, temperature=0)
    again = llm.generate(PROMPTS[0], 6, temperature=0)
    assert again.timings.cached_n == len(first.prompt_tokens) - 1   # sequence 0 is still cached
    assert again.tokens == first.tokens
    assert [c.tokens for c in many] == [llm.generate(p, 6, temperature=0).tokens for p in PROMPTS[1:3]]
    assert llm.context.memory.n_used == llm.context.memory.seq_pos_max(0) + 1   # the batch's sequences are gone


def test_decode_status_1_defers_the_prompt_chunks_and_spares_the_generating_slots(engine, monkeypatch):
    """llama.cpp's "no KV slot" (cache unchanged): the step retries with the generating tokens alone."""
    a, b = engine.vocab.tokenize(PROMPTS[0]), engine.vocab.tokenize(PROMPTS[1])
    solo = [alone(engine, p, max_tokens=8) for p in (a, b)]
    engine.clear_cache()
    decode, refused = engine.ctx.decode, []

    def full_once(batch):   # refuse the first batch that mixes a prompt chunk with a generating token
        if not refused and len(batch.tokens) > 1 and len(set(batch.seq_id.tolist())) > 1:
            refused.append(batch.n_tokens)
            return 1
        return decode(batch)

    monkeypatch.setattr(engine.ctx, "decode", full_once)
    done: list = [None, None]
    engine.submit(Request(a, lambda ev: done.__setitem__(0, ev) if isinstance(ev, Done) else None,
                          max_tokens=8, sampling=GREEDY))
    engine.step()
    engine.step()                   # `a` is generating now
    engine.submit(Request(b, lambda ev: done.__setitem__(1, ev) if isinstance(ev, Done) else None,
                          max_tokens=8, sampling=GREEDY))
    engine.run_until_idle(TIMEOUT_S)
    assert refused, "the refusal was never exercised"
    assert [d.completion.tokens for d in done] == [c.tokens for c in solo]
