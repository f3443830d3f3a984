"""The prefix cache shared across slots (generation/prefix_cache.py): a request starts from the longest prefix
any slot holds, evaluates only the rest, and decodes exactly what it decodes alone (the CPU kernels are batch
invariant and a shared cell holds the same bits it would have held in the request's own sequence)."""
from __future__ import annotations

import pytest

from ggflow.core.context import Context
from ggflow.core.model import Model
from ggflow.core.sampling import SamplingParams
from ggflow.generation.prefix_cache import BLOCK, PrefixIndex, block_keys
from ggflow.generation.slot import Slot
from ggflow.serving import Done, Engine, Request
from tests.fixtures.default_model import needs_model

GREEDY = SamplingParams(temperature=0)
TIMEOUT_S = 300
SYSTEM = ("You are a careful assistant for a shipping company. Answer questions about parcels, customs forms, "
          "delivery windows and lost items. Be brief, polite and precise; never invent tracking numbers. ") * 3
QUESTIONS = [" Where is my parcel?", " How do I fill in a customs form?", " Can I change the delivery day?",
             " What if an item is lost?"]


@pytest.fixture(scope="module")
def model():
    from ggflow.api import default_model_path
    return Model.load(default_model_path())


def submit(engine, tokens, done, i, **options):
    def sink(ev):
        if isinstance(ev, Done):
            done[i] = ev
    engine.submit(Request(tokens, sink, max_tokens=options.pop("max_tokens", 8), sampling=GREEDY, **options))


def run(engine, prompts, **options):
    done = [None] * len(prompts)
    for i, p in enumerate(prompts):
        submit(engine, p, done, i, **dict(options))
    engine.run_until_idle(TIMEOUT_S)
    assert all(d is not None and d.error is None for d in done), done
    return [d.completion for d in done]


def prompts(vocab):
    head = vocab.tokenize(SYSTEM)
    return head, [head + vocab.tokenize(q, add_special=False) for q in QUESTIONS]


# -- the index alone -------------------------------------------------------------------------------------
def test_block_keys_name_whole_prefixes():
    a = list(range(40))
    b = [99] + a[1:]                       # same second block, different first: its key must differ
    assert len(block_keys(a)) == 40 // BLOCK
    assert block_keys(a)[1] != block_keys(b)[1]
    assert block_keys(a) == block_keys(a[:BLOCK]) + block_keys(a, block_keys(a[:BLOCK])[0], 1)


def test_index_finds_the_slot_with_the_longest_block_prefix_and_follows_changes():
    slots = [Slot(i, i, 512) for i in range(3)]
    slots[0].cache_tokens, slots[0].n_reusable = list(range(100)), 100
    slots[1].cache_tokens, slots[1].n_reusable = list(range(40)) + [7] * 60, 100
    index = PrefixIndex()
    index.refresh(slots)
    assert index.holders(list(range(80)) + [1, 2]) == [0]
    assert index.holders(list(range(20)) + [5] * 30) == [0, 1]
    slots[0].cache_tokens = [3] * 100         # replaced: its old keys are gone
    index.refresh(slots)
    assert index.holders(list(range(80))) == [1]
    slots[1].cache_tokens.extend(range(10))   # grown in place but not reusable beyond n_reusable
    slots[1].n_reusable = 20                  # shortened (a context shift keeps the head)
    index.refresh(slots)
    assert index.holders(list(range(40))) == [1]   # one block still held
    assert index.holders([5] * 40) == [0, 1, 2]    # nothing shared: every slot


# -- the engine ------------------------------------------------------------------------------------------
@needs_model
def test_request_reuses_a_prefix_another_slot_computed(model):
    engine = Engine(Context(model, n_ctx=1024, n_threads=1), n_slots=2)
    head, (p0, p1, *_) = prompts(engine.vocab)
    solo = run(engine, [p1])[0]
    engine.clear_cache()
    first = run(engine, [p0])[0]                     # one slot now holds head + question 0
    done = [None, None]
    submit(engine, p0 + engine.vocab.tokenize(" And", add_special=False), done, 0, max_tokens=30)
    engine.step()                                    # that slot is busy with a continuation of its cache
    submit(engine, p1, done, 1)                      # only the other slot is idle: it copies the prefix
    engine.run_until_idle(TIMEOUT_S)
    second = done[1].completion
    shared = len(head)
    assert len({s.id for s in engine.slots if s.cache_tokens[:shared] == head}) == 2
    assert first.timings.cached_n == 0
    assert second.timings.cached_n >= shared - 1 and second.timings.prompt_n == len(p1) - second.timings.cached_n
    assert second.tokens == solo.tokens and second.text == solo.text
    assert engine.metrics.snapshot().prompt_tokens_shared_total >= shared - 1


@needs_model
def test_requests_arriving_together_evaluate_the_shared_prompt_once(model):
    engine = Engine(Context(model, n_ctx=2048, n_threads=1), n_slots=4)
    head, ps = prompts(engine.vocab)
    solo = []
    for p in ps:
        engine.clear_cache()
        solo.append(run(engine, [p])[0])
    engine.clear_cache()
    before = engine.metrics.snapshot()
    together = run(engine, ps)
    m = engine.metrics.snapshot()
    evaluated = m.prompt_tokens_total - before.prompt_tokens_total
    suffixes = sum(len(p) - len(head) for p in ps)
    assert evaluated <= len(head) + suffixes + len(ps)      # the head once (+ at most a token each)
    assert [c.tokens for c in together] == [c.tokens for c in solo]
    assert sum(c.timings.cached_n for c in together) >= 3 * (len(head) - 1)


@needs_model
def test_unreferenced_prefixes_are_evicted_least_recently_used_under_a_small_cache(model):
    ctx = Context(model, n_ctx=256, n_threads=1)
    engine = Engine(ctx, n_slots=3)
    vocab = engine.vocab
    a, b, c = (vocab.tokenize(f"Story {name}: " + "words of the tale go on and on. " * 9) for name in "ABC")
    assert 3 * (len(a) + 8) > ctx.memory.size > 2 * (len(a) + 8)  # two fit, the third needs an eviction
    run(engine, [a])
    n0 = engine.metrics.snapshot().n_decode_total
    run(engine, [b])                                 # a is now the least recently used
    n1 = engine.metrics.snapshot().n_decode_total
    run(engine, [c])                                 # room for c: a's cells go, b's stay
    n2 = engine.metrics.snapshot().n_decode_total
    assert n2 - n1 == n1 - n0                        # c's prompt in one chunk, as b's: the room was made first
    held = sorted(len(s.cache_tokens) for s in engine.slots)
    assert held[0] == 0 and held[1] > 0 and held[2] > 0
    again = run(engine, [b])[0]
    assert again.timings.cached_n == len(b) - 1     # b survived the eviction
    again = run(engine, [a])[0]
    assert again.timings.cached_n < len(a) - 1      # a did not


@needs_model
def test_a_request_waiting_for_a_prefix_goes_on_when_its_evaluator_is_cancelled(model):
    engine = Engine(Context(model, n_ctx=1024, n_threads=1, n_ubatch=32), n_slots=2)
    head, (p0, p1, *_) = prompts(engine.vocab)
    solo = run(engine, [p1])[0]
    engine.clear_cache()
    done = [None, None]
    submit(engine, p0, done, 0)
    submit(engine, p1, done, 1)
    engine.step()                                    # p0's first 32-token chunk; p1 waits for the head
    assert engine.n_waiting == 1
    leader = next(s for s in engine.slots if s.is_busy)
    leader.request.cancel()
    engine.run_until_idle(TIMEOUT_S)
    assert done[0] is None and done[1].error is None    # a cancelled request gets no Done
    assert done[1].completion.tokens == solo.tokens
    assert 0 < done[1].completion.timings.cached_n < len(head)   # what the leader had evaluated was reused


@needs_model
def test_no_sharing_across_slots_with_context_shift(model):
    """A shift moves a sequence's cells (seq_add), which cells another sequence sees cannot do."""
    engine = Engine(Context(model, n_ctx=1024, n_threads=1), n_slots=2, context_shift=True)
    _, (p0, p1, *_) = prompts(engine.vocab)
    run(engine, [p0])
    second = run(engine, [p1])[0]
    assert engine.metrics.snapshot().prompt_tokens_shared_total == 0
    assert second.timings.cached_n > 0 and sum(1 for s in engine.slots if s.cache_tokens) == 1   # reused in place


@needs_model
def test_generate_many_evaluates_a_shared_prefix_once():
    import ggflow

    llm = ggflow.LLM(n_ctx=1024, n_threads=1)
    head, ps = prompts(llm.vocab)
    solo = []
    for p in ps:
        llm.reset()
        solo.append(llm.generate(p, max_tokens=6, temperature=0))
    many = llm.generate_many(ps, max_tokens=6, temperature=0)
    assert [c.tokens for c in many] == [c.tokens for c in solo]
    assert sorted(c.timings.cached_n >= len(head) - 1 for c in many) == [False, True, True, True]


def test_index_notices_a_list_cut_and_refilled_in_place():
    slots = [Slot(0, 0, 512), Slot(1, 1, 512)]
    slots[0].cache_tokens, slots[0].n_reusable = list(range(64)), 64
    index = PrefixIndex()
    index.refresh(slots)
    del slots[0].cache_tokens[40:]               # e.g. rejected tokens removed, then others written
    slots[0].cache_tokens.extend([9] * 24)
    index.refresh(slots)
    assert index.holders(list(range(64))) == [0]                  # the first two blocks are still held
    assert index.holders(list(range(40)) + [9] * 24) == [0]
    slots[1].cache_tokens, slots[1].n_reusable = list(range(64)), 64
    index.refresh(slots)
    assert index.holders(list(range(64))) == [1]                  # only slot 1 holds all four blocks now
