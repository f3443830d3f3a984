"""Speculative decoding (ggflow.generation.speculative, draft_model): the output is the plain output.

The reference is ggflow's own plain decoding, which other tests hold to llama.cpp's logits: greedy text
with a drafter must be token-identical to greedy text without one, and a seeded sampled generation must give
the same tokens, because every kept token is sampled from the target's own row with the same random draws
in the same order (llama.cpp's acceptance rule). Generations are short to keep the suite fast.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggflow
from ggflow.core.context import Context
from ggflow.core.model import Model
from ggflow.errors import ArgumentError, GGFlowError
from ggflow.generation.draft_model import DraftModelDrafter, IncompatibleDraftError, load_draft_model
from ggflow.generation.engine import Engine
from ggflow.generation.request import Done, Request
from ggflow.generation.speculative import CallableDrafter, LlamaPromptLookupDecoding
from ggflow.core.sampling import SamplingParams
from tests.data_dir import DATA
from tests.fixtures.default_model import needs_model

MODELS = DATA / "models"
TINY_Q8, TINY_Q4 = MODELS / "tiny-llama-hs-q8_0.gguf", MODELS / "tiny-llama-hs-q4_0.gguf"
needs_tiny = pytest.mark.skipif(not TINY_Q8.exists(), reason=f"{TINY_Q8} is missing (the shared tiny models)")

CODE = '''def area(width, height):
    """The area of a rectangle."""
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
'''
EDIT = ("Rewrite this code, renaming width to w:\n```python\n" + CODE + "```\nRewritten:\n```python\n")
N_TOKENS = 40


# -- the prompt lookup drafter itself ----------------------------------------------------------------
def test_prompt_lookup_drafts_what_followed_the_earliest_match():
    ids = np.array([5, 6, 7, 8, 9, 5, 6, 1, 5, 6], np.intc)
    # the bigram (5, 6) first occurs at 0: the draft is what followed it, up to num_pred_tokens
    assert list(LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=3)(ids)) == [7, 8, 9]
    assert list(LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)(ids)) == [7, 8, 9, 5, 6, 1, 5, 6]
    assert list(LlamaPromptLookupDecoding()(np.array([1, 2, 3], np.intc))) == []   # no earlier match


def test_prompt_lookup_falls_back_to_shorter_ngrams():
    ids = np.array([4, 9, 3, 8, 9], np.intc)   # (8, 9) never occurred before; 9 did, followed by 3
    assert list(LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=2)(ids)) == [3, 8]


@pytest.mark.parametrize("name,value", [("num_pred_tokens", 0), ("num_pred_tokens", 1025), ("max_ngram_size", 0),
                                        ("num_pred_tokens", 2.5), ("max_ngram_size", True)])
def test_prompt_lookup_refuses_out_of_range_sizes(name, value):
    with pytest.raises(ArgumentError, match=name):
        LlamaPromptLookupDecoding(**{name: value})


def test_llama_cpp_python_names_are_exported():
    assert ggflow.LlamaPromptLookupDecoding is LlamaPromptLookupDecoding
    assert issubclass(LlamaPromptLookupDecoding, ggflow.LlamaDraftModel)


# -- the default model, through LLM --------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain():
    return ggflow.LLM(n_ctx=1024)


@pytest.fixture(scope="module")
def ngram():
    return ggflow.LLM(n_ctx=1024, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))


@pytest.fixture(scope="module")
def self_draft():
    """The default model drafting for itself: the draft is (almost) always right, the worst case for bugs
    in keeping long accepted runs."""
    return ggflow.LLM(n_ctx=1024, draft_model=ggflow.default_model_path())


@needs_model
def test_greedy_ngram_is_token_identical_and_accepts_drafts(plain, ngram):
    a = plain.generate(EDIT, max_tokens=N_TOKENS, temperature=0)
    b = ngram.generate(EDIT, max_tokens=N_TOKENS, temperature=0)
    assert b.tokens == a.tokens and b.text == a.text and b.finish_reason == a.finish_reason
    assert b.timings.draft_n > 0 and 0 < b.timings.draft_n_accepted <= b.timings.draft_n
    assert b.timings.as_dict()["draft_n_accepted"] == b.timings.draft_n_accepted
    assert "draft_n" not in a.timings.as_dict()   # llama-server leaves them out without speculation
    # the rejected drafts' K/V are gone: the cache holds exactly the prompt and the evaluated output
    slot = ngram._engine.slots[0]
    assert ngram.context.memory.n_used == len(slot.cache_tokens) == len(b.prompt_tokens) + len(b.tokens) - 1


@needs_model
def test_greedy_draft_model_is_token_identical(plain, self_draft):
    a = plain.generate(EDIT, max_tokens=N_TOKENS, temperature=0)
    b = self_draft.generate(EDIT, max_tokens=N_TOKENS, temperature=0)
    assert b.tokens == a.tokens and b.text == a.text
    assert b.timings.draft_n_accepted >= b.timings.draft_n // 2   # a model agrees with itself


@needs_model
@pytest.mark.parametrize("which", ["ngram", "self_draft"])
def test_seeded_sampling_gives_the_plain_text(plain, which, request):
    llm = request.getfixturevalue(which)
    options = dict(max_tokens=N_TOKENS, temperature=0.8, top_k=40, seed=1234)
    a = plain.generate(EDIT, **options)
    b = llm.generate(EDIT, **options)
    assert b.tokens == a.tokens
    assert b.timings.draft_n_accepted > 0


@needs_model
@pytest.mark.parametrize("which", ["ngram", "self_draft"])
def test_a_stop_string_inside_an_accepted_run_ends_it_there(plain, which, request):
    llm = request.getfixturevalue(which)
    full = plain.generate(EDIT, max_tokens=N_TOKENS, temperature=0).text
    stop = "height)"        # copied from the prompt, so it comes inside a drafted run
    assert stop in full
    a = plain.generate(EDIT, max_tokens=N_TOKENS, temperature=0, stop=[stop])
    b = llm.generate(EDIT, max_tokens=N_TOKENS, temperature=0, stop=[stop])
    assert b.text == a.text == full[: full.index(stop)] and b.finish_reason == "stop"
    assert b.tokens == a.tokens and b.timings.draft_n_accepted > 0
    assert llm.context.memory.n_used == len(llm._engine.slots[0].cache_tokens)


@needs_model
@pytest.mark.parametrize("which", ["ngram", "self_draft"])
def test_a_grammar_is_kept_inside_drafted_runs(plain, which, request):
    """The grammar forbids the identifier the prompt spells: drafts copying it are rejected by the chain."""
    llm = request.getfixturevalue(which)
    grammar = r'''root ::= "def " name "(" [a-z, ]* "):" [^\x00]*
name ::= "surface" | "area_of" '''
    a = plain.generate(EDIT, max_tokens=N_TOKENS, temperature=0, grammar=grammar)
    b = llm.generate(EDIT, max_tokens=N_TOKENS, temperature=0, grammar=grammar)
    assert b.tokens == a.tokens and b.text == a.text
    assert b.text.startswith(("def surface(", "def area_of("))
    assert b.timings.draft_n > b.timings.draft_n_accepted > 0   # drafts were cut where the grammar disagreed


@needs_model
def test_max_tokens_inside_a_draft_stops_exactly(plain, ngram):
    for n in (1, 2, 7):
        a = plain.generate(EDIT, max_tokens=n, temperature=0)
        b = ngram.generate(EDIT, max_tokens=n, temperature=0)
        assert b.tokens == a.tokens and len(b.tokens) == n and b.finish_reason == "length"


@needs_model
def test_logprobs_come_from_the_verified_rows(plain, ngram):
    a = plain.generate(EDIT, max_tokens=12, temperature=0, logprobs=2)
    b = ngram.generate(EDIT, max_tokens=12, temperature=0, logprobs=2)
    assert b.tokens == a.tokens and b.timings.draft_n_accepted > 0
    # batch invariance (test_batch_invariance.py): a row is the same whether its token was alone or drafted
    np.testing.assert_allclose([t.logprob for t in b.logprobs], [t.logprob for t in a.logprobs], rtol=0, atol=1e-5)


# -- several slots at once: drafts beside prompts and plain slots in one batch --------------------------
def _run(engine: Engine, prompts: list[list[int]], sampling: SamplingParams, max_tokens: int):
    results: dict[int, Done] = {}
    for i, p in enumerate(prompts):
        engine.submit(Request(p, lambda ev, i=i: results.__setitem__(i, ev) if isinstance(ev, Done) else None,
                              max_tokens=max_tokens, sampling=sampling))
    engine.run_until_idle(timeout=300)
    return [results[i].completion for i in range(len(prompts))]


@needs_tiny
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0), SamplingParams(temperature=0.9, seed=7)],
                         ids=["greedy", "seeded"])
def test_engine_slots_with_a_draft_model_match_plain_slots(sampling):
    model = Model.load(str(TINY_Q8))
    vocab = model.vocab
    prompts = [vocab.tokenize(t) for t in ("the rain in spain", "hello there hello there hello", "a b c a b c a b")]
    plain = _run(Engine(Context(model, n_ctx=256, n_threads=1), n_slots=3), prompts, sampling, 24)
    engine = Engine(Context(model, n_ctx=256, n_threads=1), n_slots=3)
    engine.drafter = load_draft_model(TINY_Q4, engine.ctx, n_max=4, n_threads=1)
    spec = _run(engine, prompts, sampling, 24)
    assert [c.tokens for c in spec] == [c.tokens for c in plain]
    m = engine.metrics.snapshot()
    assert m.spec_decode_num_draft_tokens_total == sum(c.timings.draft_n for c in spec) > 0
    assert m.spec_decode_num_accepted_tokens_total == sum(c.timings.draft_n_accepted for c in spec)
    assert m.tokens_predicted_total == sum(len(c.tokens) for c in spec)


@needs_tiny
def test_wrong_drafts_are_all_rejected_and_change_nothing():
    """A drafter proposing random (and out-of-vocabulary) ids: the output is still the plain one."""
    model = Model.load(str(TINY_Q8))
    prompts = [model.vocab.tokenize("the rain in spain"), model.vocab.tokenize("one two three")]
    greedy = SamplingParams(temperature=0)
    plain = _run(Engine(Context(model, n_ctx=128, n_threads=1), n_slots=2), prompts, greedy, 20)
    rng = np.random.default_rng(0)
    engine = Engine(Context(model, n_ctx=128, n_threads=1), n_slots=2)
    engine.drafter = CallableDrafter(lambda ids: np.append(rng.integers(0, model.vocab.n_vocab, 5), 10**6),
                                     model.vocab.n_vocab)
    spec = _run(engine, prompts, greedy, 20)
    assert [c.tokens for c in spec] == [c.tokens for c in plain]
    assert all(c.timings.draft_n > 0 for c in spec)
    assert engine.ctx.memory.n_used == sum(len(s.cache_tokens) for s in engine.slots)


@needs_tiny
def test_drafts_stop_at_the_end_of_the_context():
    model = Model.load(str(TINY_Q8))
    prompt = model.vocab.tokenize("a b c a b c a b c a b c")
    n_ctx = len(prompt) + 9
    engine = Engine(Context(model, n_ctx=n_ctx, n_threads=1), n_slots=1)
    engine.drafter = CallableDrafter(LlamaPromptLookupDecoding(num_pred_tokens=50), model.vocab.n_vocab)
    (c,) = _run(engine, [prompt], SamplingParams(temperature=0), None)
    plain = _run(Engine(Context(model, n_ctx=n_ctx, n_threads=1), n_slots=1), [prompt], SamplingParams(temperature=0),
                 None)[0]
    assert c.tokens == plain.tokens and c.finish_reason == "length" and c.context_full


# -- refusals -----------------------------------------------------------------------------------------
def test_a_draft_model_with_another_vocabulary_is_refused_naming_both_and_the_token():
    target = Context(Model.load(str(MODELS / "tiny-gpt2-hs-f32.gguf")), n_ctx=64, n_threads=1)
    with pytest.raises(IncompatibleDraftError) as info:
        load_draft_model(MODELS / "tiny-qwen2-hs-q8_0.gguf", target)
    message = str(info.value)
    assert "tiny-qwen2-hs-q8_0.gguf" in message and "tiny-gpt2-hs-f32.gguf" in message
    assert "token 511" in message and "'Ġform'" in message and "'<|endoftext|>'" in message


@needs_tiny
def test_a_draft_model_of_another_tokenizer_type_is_refused():
    with pytest.raises(IncompatibleDraftError, match="vocabulary type is 'gpt2', the target's is 'llama'"):
        ggflow.LLM(str(TINY_Q8), n_ctx=64, draft_model=str(MODELS / "tiny-gpt2-hs-f32.gguf"))


@needs_tiny
@pytest.mark.parametrize("options,name", [(dict(n_max=0), "draft_max"), (dict(n_max=1025), "draft_max"),
                                          (dict(n_max=4, n_min=5), "draft_min"), (dict(p_min=1.5), "draft_p_min")])
def test_draft_options_out_of_range_are_argument_errors(options, name):
    ctx = Context(Model.load(str(TINY_Q4)), n_ctx=64, n_threads=1)
    with pytest.raises(ArgumentError, match=name):
        DraftModelDrafter(ctx, ctx.model.vocab.n_vocab, **options)


@needs_tiny
def test_draft_model_settings_travel_with_the_path():
    from ggflow.generation.draft_model import DraftModel

    llm = ggflow.LLM(str(TINY_Q8), n_ctx=64, n_threads=1, draft_model=DraftModel(TINY_Q4, n_max=7, n_min=2, p_min=0.5))
    drafter = llm._engine.drafter
    assert (drafter.n_max, drafter.n_min, drafter.p_min) == (7, 2, 0.5)
    with pytest.raises(ArgumentError, match="draft_max"):
        ggflow.LLM(str(TINY_Q8), n_ctx=64, n_threads=1, draft_model=DraftModel(TINY_Q4, n_max=0))


@needs_tiny
@pytest.mark.parametrize("value", [42, "/no/such/draft.gguf"])
def test_a_draft_model_that_is_neither_path_nor_drafter_is_refused(value):
    with pytest.raises(ArgumentError, match="draft_model"):
        ggflow.LLM(str(TINY_Q8), n_ctx=64, draft_model=value)


def test_draft_model_is_an_accepted_llm_option():
    with pytest.raises(GGFlowError, match="draft_model"):   # the refusal of unknown options lists it
        ggflow.LLM(str(TINY_Q8), n_ctx=64, no_such_option=1)


# -- llama.cpp's ngram-simple, against a transcription of common_ngram_simple_draft's loops ---------------
def _llama_cpp_ngram_simple(tokens: list[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    cur_len = len(tokens)
    if cur_len <= size_n + size_m + 1:
        return []
    pattern = tokens[cur_len - size_n + 1:] + [sampled]
    match_pos = 0
    for j in range(cur_len - size_n - 1, 0, -1):
        if tokens[j: j + size_n] == pattern:
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(size_m, cur_len - (match_pos + size_n))
    return [] if copy_max < size_n else tokens[match_pos + size_n: match_pos + size_n + copy_max]


@pytest.mark.parametrize("size_n,size_m", [(1, 3), (2, 4), (3, 8), (12, 48)])
def test_ngram_simple_drafts_what_llama_cpp_drafts(size_n, size_m):
    from ggflow.generation.speculative import NgramSimple

    rng = np.random.default_rng(size_n * 100 + size_m)
    drafter = NgramSimple(size_n, size_m)
    n_drafted = 0
    for _ in range(300):
        ids = [int(t) for t in rng.integers(0, 4, rng.integers(2, 120))]   # 4 symbols: many repeats
        got = list(drafter(np.asarray(ids, np.intc)))
        assert got == _llama_cpp_ngram_simple(ids[:-1], ids[-1], size_n, size_m), ids
        n_drafted += bool(got)
    assert n_drafted > 0 or size_n == 12


@needs_model
def test_greedy_ngram_simple_is_token_identical(plain):
    from ggflow.generation.speculative import NgramSimple

    llm = ggflow.LLM(n_ctx=1024, draft_model=NgramSimple(size_n=3, size_m=16))
    a = plain.generate(EDIT, max_tokens=N_TOKENS, temperature=0)
    b = llm.generate(EDIT, max_tokens=N_TOKENS, temperature=0)
    assert b.tokens == a.tokens and b.timings.draft_n_accepted > 0


@needs_tiny
def test_a_shifting_context_with_drafts_gives_the_plain_tokens():
    """context_shift: drafts never pass the end of the context, and after a shift the drafter (a draft model
    re-syncing its own cache) goes on from the shifted tokens."""
    prompt = "a b c a b c a b c"
    plain = ggflow.LLM(str(TINY_Q8), n_ctx=48, n_threads=1, context_shift=True, n_keep=2)
    spec = ggflow.LLM(str(TINY_Q8), n_ctx=48, n_threads=1, context_shift=True, n_keep=2, draft_model=str(TINY_Q4))
    a = plain.generate(prompt, max_tokens=100, temperature=0)
    b = spec.generate(prompt, max_tokens=100, temperature=0)
    assert b.tokens == a.tokens and len(b.tokens) == 100 and b.n_context_shifts == a.n_context_shifts >= 2
    assert b.timings.draft_n > 0


@needs_tiny
def test_sibling_choices_speculate_like_plain_ones():
    model = Model.load(str(TINY_Q8))
    prompt = model.vocab.tokenize("the rain in spain")

    def run(drafter):
        engine = Engine(Context(model, n_ctx=256, n_threads=1), n_slots=3)
        engine.drafter = drafter
        done: dict[int, Done] = {}
        siblings = [Request(prompt, lambda ev, i=i: done.__setitem__(i, ev) if isinstance(ev, Done) else None,
                            max_tokens=20, sampling=SamplingParams(temperature=0.9, seed=i)) for i in (1, 2)]
        engine.submit(Request(prompt, lambda ev: done.__setitem__(0, ev) if isinstance(ev, Done) else None,
                              max_tokens=20, sampling=SamplingParams(temperature=0.9, seed=0), siblings=siblings))
        engine.run_until_idle(timeout=300)
        return [done[i].completion for i in range(3)]

    plain = run(None)
    spec = run(CallableDrafter(lambda ids: np.asarray(ids[-4:]), model.vocab.n_vocab))   # repeat the last 4
    assert [c.tokens for c in spec] == [c.tokens for c in plain]
    assert len({tuple(c.tokens) for c in plain}) > 1 and all(c.timings.draft_n > 0 for c in spec)


@needs_tiny
def test_a_draft_model_drafts_its_own_greedy_continuation_within_its_limits():
    from ggflow.generation.speculative import DraftRequest

    tokens = ggflow.LLM(str(TINY_Q4), n_ctx=128, n_threads=1).tokenize(b"the rain in spain")
    reference = ggflow.LLM(str(TINY_Q4), n_ctx=128, n_threads=1).generate(tokens, max_tokens=6, temperature=0).tokens
    ctx = Context(Model.load(str(TINY_Q4)), n_ctx=128, n_threads=1)
    drafter = DraftModelDrafter(ctx, ctx.model.vocab.n_vocab, n_max=6)
    other = tokens[:-1] + [reference[0]]          # a second sequence drafting in the same batches
    first, second = drafter.draft([DraftRequest(3, tokens, 6), DraftRequest(5, other, 2)])
    assert first == reference and len(second) == 2
    # the cache follows: a later call for the same sequence evaluates only what changed
    assert drafter.draft([DraftRequest(3, tokens + reference[:2], 4)]) == [reference[2:6]]
    assert DraftModelDrafter(ctx, ctx.model.vocab.n_vocab, n_max=6, n_min=6).draft(
        [DraftRequest(7, tokens, 3)]) == [[]]                       # shorter than n_min: dropped
    assert DraftModelDrafter(ctx, ctx.model.vocab.n_vocab, n_max=6, p_min=1.0).draft(
        [DraftRequest(9, tokens, 6)]) == [[]]                       # no token is that sure


@pytest.mark.parametrize("swa_full", [False, True])
def test_a_window_cache_smaller_than_the_context_does_not_speculate(tiny_model_path, swa_full):
    """Rejected drafts could not always be removed from it (their writes may evict cells the window needs
    back); with swa_full the window cache has every cell and speculation goes on, with the plain output.
    (The window cache has 256 cells at least: a context of 512 is larger.)"""
    from tests.test_kv_cache_iswa import _model

    model = _model(tiny_model_path("llama"), "iswa", swa_full=swa_full)
    prompt = model.vocab.tokenize("a b c a b c a b c a b c")
    greedy = SamplingParams(temperature=0)
    plain = _run(Engine(Context(model, n_ctx=512, n_ubatch=16, n_threads=1), n_slots=1), [prompt], greedy, 30)[0]
    engine = Engine(Context(model, n_ctx=512, n_ubatch=16, n_threads=1), n_slots=1)
    engine.drafter = CallableDrafter(lambda ids: np.asarray(ids[-4:]), model.vocab.n_vocab)
    (spec,) = _run(engine, [prompt], greedy, 30)
    assert spec.tokens == plain.tokens
    assert (spec.timings.draft_n > 0) == swa_full
