"""Built-in samplers (llama.cpp's semantics), SamplingParams / build_chain, and samplers added through the hook."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggflow.core.sampling import (DEFAULT_SAMPLER_ORDER, LogitsProcessorSampler, SamplerBase, SamplerChain,
                                  SamplingParams, TokenDataArray, build_chain, make_sampler)
from ggflow.errors import GGFlowError, UnknownNameError
from ggflow.plugins import get_plugin_manager, hookimpl

BUILTIN = ("greedy", "dist", "top_k", "top_p", "min_p", "typical", "temp", "temp_ext", "xtc", "top_n_sigma",
           "mirostat", "mirostat_v2", "penalties", "dry", "logit_bias", "logits_processor")
VOCAB = 49152  # SmolLM2's


def random_logits(n: int, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def candidates(logits) -> TokenDataArray:
    return TokenDataArray.from_logits(np.asarray(logits, dtype=np.float32))


def applied(sampler, logits) -> TokenDataArray:
    cur = candidates(logits)
    sampler.apply(cur)
    return cur


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


# -- a reference std::mt19937 and llama.cpp's dist, written from the C++ standard and llama-sampler.cpp ------------
class ReferenceMT19937:
    def __init__(self, seed: int):
        self.state = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            prev = self.state[-1]
            self.state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.index = 624

    def __call__(self) -> int:
        if self.index >= 624:
            mt = self.state
            for i in range(624):
                y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
                mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.index = 0
        y = self.state[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def canonical_double(self) -> float:  # generate_canonical<double, 53>: two 32-bit draws
        lo, hi = self(), self()
        return (lo + hi * 2.0 ** 32) / 2.0 ** 64


def reference_dist_pick(logits: np.ndarray, rng: ReferenceMT19937) -> int:
    weights = np.exp(logits - logits.max())
    total, target = 0.0, None
    for w in weights:
        total += float(w)
    target = total * rng.canonical_double()
    running = 0.0
    for i, w in enumerate(weights):
        running += float(w)
        if running >= target:
            return i
    return len(weights) - 1


def test_reference_mt19937_is_the_standard_one():
    rng = ReferenceMT19937(5489)  # the C++ standard: the 10000th output of a default mt19937 is 4123659995
    for _ in range(9999):
        rng()
    assert rng() == 4123659995


# -- registry ---------------------------------------------------------------------------------------------------
def test_every_builtin_sampler_is_registered_by_the_ggflow_distribution():
    samplers = get_plugin_manager().samplers
    for name in BUILTIN:
        assert samplers.registration(name).source.distribution == "ggflow", name


def test_make_sampler_builds_a_builtin_by_name_with_its_parameters():
    sampler = make_sampler("top_k", k=40)
    assert sampler.name == "top_k" and sampler.k == 40
    with pytest.raises(GGFlowError, match="does not take"):
        make_sampler("top_k", kk=40)


# -- greedy, dist -----------------------------------------------------------------------------------------------
def test_greedy_picks_the_argmax_and_the_first_of_equals():
    logits = random_logits(1000, 1)
    assert applied(make_sampler("greedy"), logits).selected_token == int(np.argmax(logits))
    assert applied(make_sampler("greedy"), [1.0, 3.0, 3.0, 2.0]).selected_token == 1


def test_dist_draws_what_llama_cpp_draws_for_the_same_seed():
    logits = random_logits(300, 2)
    for seed in (0, 1, 1234):
        ours, ref = make_sampler("dist", seed=seed), ReferenceMT19937(seed)
        for _ in range(25):
            assert applied(ours, logits).selected == reference_dist_pick(logits, ref)


def test_dist_is_reproducible_with_a_seed_and_differs_across_seeds():
    logits = random_logits(VOCAB, 3, scale=1.0)

    def run(seed):
        chain = SamplerChain([make_sampler("dist", seed=seed)])
        return [chain.sample(logits) for _ in range(20)]

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert run(None) != run(None)  # no seed: a random one each time


def test_dist_samples_according_to_the_probabilities():
    probs = np.array([0.05, 0.1, 0.15, 0.2, 0.5])
    logits = np.log(probs).astype(np.float32)
    dist, n = make_sampler("dist", seed=11), 20000
    counts = np.bincount([applied(dist, logits).selected for _ in range(n)], minlength=5)
    chi2 = (((counts - n * probs) ** 2) / (n * probs)).sum()
    assert chi2 < 18.47  # 4 degrees of freedom, p = 0.001


def test_dist_leaves_normalized_probabilities():
    cur = applied(make_sampler("dist", seed=1), random_logits(500, 4))
    assert cur.probs.sum() == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(cur.probs, softmax(cur.logits), rtol=1e-4, atol=1e-7)


def test_dist_reset_restarts_the_seeded_sequence_and_clone_continues_it():
    logits = random_logits(200, 5, scale=0.5)
    dist = make_sampler("dist", seed=99)
    first = [applied(dist, logits).selected for _ in range(10)]
    twin = dist.clone()
    assert [applied(twin, logits).selected for _ in range(10)] == [applied(dist, logits).selected for _ in range(10)]
    dist.reset()
    assert [applied(dist, logits).selected for _ in range(10)] == first


# -- truncation ---------------------------------------------------------------------------------------------------
def test_top_k_keeps_exactly_the_k_highest_in_descending_order():
    logits = random_logits(VOCAB, 6)
    cur = applied(make_sampler("top_k", k=40), logits)
    assert len(cur) == 40 and cur.sorted
    np.testing.assert_array_equal(cur.logits, np.sort(logits)[::-1][:40])
    np.testing.assert_array_equal(logits[cur.ids], cur.logits)
    assert len(applied(make_sampler("top_k", k=0), logits)) == VOCAB
    assert len(applied(make_sampler("top_k", k=10), logits[:5])) == 5


def test_top_k_over_mostly_masked_candidates():
    logits = random_logits(VOCAB, 20)
    logits[logits < 4.0] = -np.inf  # as top_n_sigma or a grammar leaves them
    cur = applied(make_sampler("top_k", k=40), logits)
    np.testing.assert_array_equal(cur.logits, np.sort(logits)[::-1][:40])
    few = np.full(1000, -np.inf, dtype=np.float32)
    few[[7, 3, 500]] = [1.0, 2.0, 0.5]
    cur = applied(make_sampler("top_k", k=5), few)
    assert cur.ids[:3].tolist() == [3, 7, 500] and len(cur) == 5 and np.all(np.isneginf(cur.logits[3:]))


def check_top_p(logits: np.ndarray, p: float, kept: TokenDataArray) -> None:
    probs = softmax(logits)
    order = np.argsort(-logits, kind="stable")
    cum = np.cumsum(probs[order])
    assert set(kept.ids.tolist()) == set(order[:len(kept)].tolist())  # the most probable ones
    assert cum[len(kept) - 1] >= p - 1e-5                              # that reach p
    assert len(kept) == 1 or cum[len(kept) - 2] < p + 1e-5             # and no fewer would


@pytest.mark.parametrize("p", [0.5, 0.9, 0.95, 0.999])
def test_top_p_keeps_the_smallest_set_reaching_p(p):
    for logits in (random_logits(VOCAB, 7, scale=2.0), random_logits(VOCAB, 8, scale=0.3), random_logits(700, 9)):
        kept = applied(make_sampler("top_p", p=p), logits)
        check_top_p(logits, p, kept)
        assert kept.sorted and np.all(np.diff(kept.logits) <= 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-20, 20, width=32), min_size=1, max_size=300), st.floats(0.01, 0.99))
def test_top_p_property(values, p):
    logits = np.array(values, dtype=np.float32)
    check_top_p(logits, p, applied(make_sampler("top_p", p=p), logits))


def test_top_p_min_keep_keeps_at_least_that_many():
    logits = np.array([10.0, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)
    assert len(applied(make_sampler("top_p", p=0.5), logits)) == 1
    assert len(applied(make_sampler("top_p", p=0.5, min_keep=3), logits)) == 3


@pytest.mark.parametrize("p", [0.05, 0.2, 0.7])
def test_min_p_keeps_tokens_at_least_p_times_as_likely_as_the_best(p):
    logits = random_logits(VOCAB, 10)
    kept = applied(make_sampler("min_p", p=p), logits)
    probs = softmax(logits)
    expected = np.flatnonzero(probs >= p * probs.max() * (1 - 1e-5))
    assert set(kept.ids.tolist()) == set(expected.tolist())


def test_min_p_falls_back_to_the_min_keep_best():
    logits = np.array([5.0, 0.0, 1.0, -1.0], dtype=np.float32)
    kept = applied(make_sampler("min_p", p=0.5, min_keep=3), logits)
    assert kept.ids.tolist() == [0, 2, 1]


def test_typical_keeps_the_candidates_closest_to_the_entropy():
    logits = random_logits(2000, 11)
    p = 0.6
    kept = applied(make_sampler("typical", p=p), logits)
    probs = softmax(logits)
    entropy = -(probs * np.log(probs)).sum()
    order = np.argsort(np.abs(-np.log(probs) - entropy), kind="stable")
    n = int(np.searchsorted(np.cumsum(probs[order]), p, side="right")) + 1
    assert kept.ids.tolist() == order[:n].tolist()


def test_typical_can_drop_the_most_likely_token():
    # one dominant token is far from the entropy, the many small ones are typical
    logits = np.concatenate([[6.0], np.zeros(1000)]).astype(np.float32)  # p0 = 0.29, the others 0.0007
    kept = applied(make_sampler("typical", p=0.5), logits)
    assert 0 not in kept.ids and len(kept) > 1


@pytest.mark.parametrize("n_sigma", [0.5, 1.0, 2.0])
def test_top_n_sigma_masks_logits_more_than_n_sigma_below_the_max(n_sigma):
    logits = random_logits(5000, 12)
    logits[:10] = -np.inf  # already masked: left out of mean and std
    out = applied(make_sampler("top_n_sigma", n=n_sigma), logits).logits
    live = logits[np.isfinite(logits)]
    floor = live.max() - n_sigma * live.std()
    finite = np.isfinite(out)
    np.testing.assert_array_equal(finite, np.isfinite(logits) & (logits >= floor))
    np.testing.assert_array_equal(out[finite], logits[finite])


def test_xtc_removes_all_top_choices_above_the_threshold_but_the_least_likely():
    probs = np.array([0.05, 0.4, 0.02, 0.3, 0.2, 0.03], dtype=np.float32)
    kept = applied(make_sampler("xtc", probability=1.0, threshold=0.1, seed=1), np.log(probs))
    assert sorted(kept.ids.tolist()) == [0, 2, 4, 5]  # 0.4 and 0.3 go, 0.2 is the last above 0.1


def test_xtc_fires_with_its_probability():
    logits = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    xtc = make_sampler("xtc", probability=0.3, threshold=0.1, seed=5)
    fired = sum(len(applied(xtc, logits)) < 3 for _ in range(2000))
    assert 540 < fired < 660  # 600 expected; binomial sd about 20
    assert len(applied(make_sampler("xtc", probability=1.0, threshold=0.6), logits)) == 3  # > 0.5: off


def test_xtc_does_nothing_when_one_or_no_token_is_above_the_threshold():
    logits = np.log(np.array([0.9, 0.05, 0.05], dtype=np.float32))
    assert len(applied(make_sampler("xtc", probability=1.0, threshold=0.1, seed=2), logits)) == 3


# -- temperature --------------------------------------------------------------------------------------------------
def test_temp_divides_logits_and_zero_keeps_only_the_best():
    logits = random_logits(100, 13)
    np.testing.assert_allclose(applied(make_sampler("temp", t=0.5), logits).logits, logits / 0.5, rtol=1e-6)
    out = applied(make_sampler("temp", t=0.0), logits).logits
    assert np.isfinite(out).sum() == 1 and out[np.argmax(logits)] == logits.max()



@pytest.mark.parametrize("seed, t", [(1, 1e-40), (2, 1e-40), (3, 1e-50)])    # 1e-50: 0 as a float32
def test_a_temperature_so_small_the_logits_overflow_draws_the_best_tokens_quietly(seed, t):
    # logits / 1e-40 overflow to +-inf, all but the smallest: the t -> 0 limit is a draw between the top two (tied),
    # not one among every +inf nor a NaN distribution, and no RuntimeWarning reaches the user
    logits = np.array([1.0, 3.0, -2.0, 3.0, 0.5, 1e-39], np.float32)
    chain = [make_sampler("temp", t=t), make_sampler("dist", seed=seed)]
    picks = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            cur = TokenDataArray.from_logits(logits)
            for sampler in chain:
                sampler.apply(cur)
            picks.add(int(cur.ids[cur.selected]))
            assert np.isfinite(cur.probs).all() and cur.probs.sum() == pytest.approx(1.0)
    assert picks == {1, 3}


def test_dist_over_logits_at_plus_infinity_draws_among_them():
    # a logit bias of +inf on two tokens: exp(inf - inf) would be NaN; the draw is between those two
    logits = np.array([0.0, np.inf, 5.0, np.inf], np.float32)
    dist = make_sampler("dist", seed=4)
    picks = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            cur = TokenDataArray.from_logits(logits)
            dist.apply(cur)
            picks.add(int(cur.ids[cur.selected]))
    assert picks == {1, 3}


def test_min_p_that_is_zero_as_a_float32_keeps_every_candidate_quietly():
    logits = random_logits(50, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(applied(make_sampler("min_p", p=1e-200), logits)) == 50

def test_temp_ext_moves_temperature_with_entropy_within_its_range():
    t, delta = 1.0, 0.5
    sampler = make_sampler("temp_ext", t=t, delta=delta, exponent=1.0)
    flat = np.random.default_rng(0).uniform(-0.01, 0.01, 1000).astype(np.float32) + 1.0   # entropy ~ max
    peaked = np.concatenate([[40.0], np.ones(999)]).astype(np.float32)                      # entropy ~ 0
    t_flat = np.median(flat / applied(sampler, flat).logits)
    t_peaked = (peaked / applied(sampler, peaked).logits)[0]
    assert t_flat == pytest.approx(t + delta, abs=1e-3)
    assert t_peaked == pytest.approx(t - delta, abs=1e-2)
    mid = random_logits(1000, 14)
    t_mid = (mid / applied(sampler, mid).logits)[0]
    assert t - delta < t_mid < t + delta
    np.testing.assert_allclose(applied(make_sampler("temp_ext", t=0.7), mid).logits, mid / 0.7, rtol=1e-6)


# -- penalties, dry, logit bias -----------------------------------------------------------------------------------
def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = np.array([2.0, -2.0, 2.0, -2.0, 1.0], dtype=np.float32)
    pen = make_sampler("penalties", last_n=64, repeat=2.0)
    for tok in (0, 1, 1):
        pen.accept(tok)
    np.testing.assert_allclose(applied(pen, logits).logits, [1.0, -4.0, 2.0, -2.0, 1.0])


def test_frequency_and_presence_penalties_subtract():
    logits = np.zeros(5, dtype=np.float32)
    pen = make_sampler("penalties", last_n=64, frequency=0.5, presence=0.25)
    for tok in (3, 3, 3, 1):
        pen.accept(tok)
    np.testing.assert_allclose(applied(pen, logits).logits, [0, -0.75, 0, -1.75, 0])


def test_penalties_look_only_at_the_last_n_tokens_and_find_shuffled_candidates():
    pen = make_sampler("penalties", last_n=2, presence=1.0)
    for tok in (0, 1, 2):
        pen.accept(tok)
    cur = candidates(np.zeros(4))
    cur.take(np.array([3, 2, 1, 0]))  # not in id order any more
    pen.apply(cur)
    assert dict(zip(cur.ids.tolist(), cur.logits.tolist())) == {0: 0.0, 1: -1.0, 2: -1.0, 3: 0.0}


def test_dry_penalizes_the_token_that_would_continue_a_repeat():
    dry = make_sampler("dry", multiplier=0.8, base=1.75, allowed_length=2, last_n=64)
    for tok in (1, 2, 3, 4, 9, 1, 2, 3):  # "1 2 3" was followed by 4 before
        dry.accept(tok)
    out = applied(dry, np.zeros(10)).logits
    expected = np.zeros(10, dtype=np.float32)
    expected[4] = -0.8 * 1.75 ** (3 - 2)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_dry_penalty_grows_with_the_repeat_length_and_ignores_short_ones():
    dry = make_sampler("dry", multiplier=1.0, base=2.0, allowed_length=2, last_n=64)
    for tok in (5, 6, 7, 8, 1, 2, 5, 6, 7, 8, 1, 3, 5, 6, 7):  # 5 6 7 -> 8 (twice), 1 -> 2 (too short)
        dry.accept(tok)
    out = applied(dry, np.zeros(10)).logits
    assert out[8] == pytest.approx(-(2.0 ** (3 - 2))) and out[2] == 0 and out[3] == 0
    for tok in (8, 1):
        dry.accept(tok)
    assert applied(dry, np.zeros(10)).logits[3] == pytest.approx(-(2.0 ** (5 - 2)))  # ...5 6 7 8 1 -> 3 or 2


def test_dry_sequence_breakers_stop_a_repeat():
    history = (1, 2, 3, 4, 9, 1, 2, 3)
    breaker_in_repeat = make_sampler("dry", multiplier=1.0, allowed_length=2, sequence_breakers=[[2]])
    for tok in history:
        breaker_in_repeat.accept(tok)
    assert np.all(applied(breaker_in_repeat, np.zeros(10)).logits == 0)
    breaker_is_next = make_sampler("dry", multiplier=1.0, allowed_length=2, sequence_breakers=[[4]])
    for tok in history:
        breaker_is_next.accept(tok)
    assert np.all(applied(breaker_is_next, np.zeros(10)).logits == 0)  # a single-token breaker is never penalized


class PiecesVocab:
    """Just what DRY's breaker processing asks of a vocabulary."""

    def __init__(self, pieces):
        self.pieces = [p.encode() for p in pieces]
        self.n_vocab = len(pieces)

    def token_to_piece(self, tid, special=True):
        return self.pieces[tid]

    def tokenize(self, text, add_special=False, parse_special=False):
        out, data = [], text.encode()
        while data:
            tid = max((i for i, p in enumerate(self.pieces) if data.startswith(p)), key=lambda i: len(self.pieces[i]))
            out.append(tid)
            data = data[len(self.pieces[tid]):]
        return out


def test_dry_string_breakers_become_the_token_sequences_that_spell_them():
    from ggflow.samplers_builtin.penalties import breaker_sequences
    vocab = PiecesVocab(["a", "b", "c", "x:", ":", "q*", "*", "*z", "z", "ab*c"])
    assert sorted(breaker_sequences(":", vocab)) == [(3,), (4,)]
    # "*z" is inside token 7; tokens 5 and 6 end in "*", which token 8 ("z") completes; "ab*c" never spells it
    assert sorted(breaker_sequences("*z", vocab)) == [(5, 8), (6, 8), (7,)]
    history = (2, 6, 8, 0, 1, 2, 6, 8, 0)  # "c * z a b c * z a": "c * z a" repeats, b would continue it
    plain = make_sampler("dry", multiplier=1.0, base=2.0, allowed_length=2)
    broken = make_sampler("dry", multiplier=1.0, base=2.0, allowed_length=2, sequence_breakers=["*z"], vocab=vocab)
    for tok in history:
        plain.accept(tok)
        broken.accept(tok)
    assert applied(plain, np.zeros(10)).logits[1] == -(2.0 ** (4 - 2))
    assert np.all(applied(broken, np.zeros(10)).logits == 0)  # the repeat may not reach back past "* z"
    with pytest.raises(GGFlowError, match="needs the vocabulary"):
        make_sampler("dry", multiplier=1.0, sequence_breakers=["\n"])


def test_logit_bias_adds_to_the_chosen_tokens_wherever_they_are():
    bias = make_sampler("logit_bias", bias={1: 2.5, 3: -np.inf})
    np.testing.assert_array_equal(applied(bias, np.zeros(5)).logits, [0, 2.5, 0, -np.inf, 0])
    cur = candidates(np.arange(5, dtype=np.float32))
    cur.sort_top(4)  # ids 4, 3, 2, 1: token 1 is no longer at position 1
    bias.apply(cur)
    assert dict(zip(cur.ids.tolist(), cur.logits.tolist())) == {4: 4.0, 3: -np.inf, 2: 2.0, 1: 3.5}
    with pytest.raises(GGFlowError, match="outside the vocabulary"):
        make_sampler("logit_bias", bias={7: 1.0}, n_vocab=5)


# -- mirostat -----------------------------------------------------------------------------------------------------
ZIPF = (-1.1 * np.log(np.arange(1, 4097))).astype(np.float32)[np.random.default_rng(1).permutation(4096)]


def observed_surprise(sampler, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        cur = applied(sampler, ZIPF)
        out.append(float(-np.log2(cur.probs[cur.selected])))
        sampler.accept(cur.selected_token)
    return out


@pytest.mark.parametrize("name", ["mirostat", "mirostat_v2"])
def test_mirostat_steers_the_observed_surprise_toward_tau(name):
    means = {}
    for tau in (2.0, 5.0):
        surprise = observed_surprise(make_sampler(name, tau=tau, eta=0.1, seed=3), 500)
        means[tau] = np.mean(surprise[200:])
        assert means[tau] == pytest.approx(tau, abs=0.35)
    assert means[5.0] - means[2.0] > 2.0


def test_mirostat_reset_restores_mu_and_clone_keeps_it():
    sampler = make_sampler("mirostat_v2", tau=3.0, eta=0.2, seed=4)
    observed_surprise(sampler, 20)
    assert sampler.mu != pytest.approx(6.0)
    twin = sampler.clone()
    assert twin.mu == sampler.mu and observed_surprise(twin, 5) == observed_surprise(sampler, 5)
    sampler.reset()
    assert sampler.mu == pytest.approx(6.0)


# -- clone and reset ----------------------------------------------------------------------------------------------
def test_clone_copies_history_and_then_goes_its_own_way():
    pen = make_sampler("penalties", last_n=8, presence=1.0)
    pen.accept(1)
    twin = pen.clone()
    twin.accept(2)
    assert pen.history == [1] and twin.history == [1, 2]
    pen.reset()
    assert pen.history == [] and twin.history == [1, 2]
    assert applied(pen, np.zeros(3)).logits.tolist() == [0, 0, 0]


def test_chain_clone_and_reset_reach_every_member():
    chain = build_chain(SamplingParams(seed=5, repeat_penalty=1.3, dry_multiplier=0.5, dry_sequence_breakers=()))
    logits = random_logits(1000, 15, scale=1.0)
    [chain.sample(logits) for _ in range(5)]
    twin = chain.clone()
    assert [twin.sample(logits) for _ in range(8)] == [chain.sample(logits) for _ in range(8)]
    chain.reset()
    fresh = build_chain(SamplingParams(seed=5, repeat_penalty=1.3, dry_multiplier=0.5, dry_sequence_breakers=()))
    assert [chain.sample(logits) for _ in range(8)] == [fresh.sample(logits) for _ in range(8)]


# -- SamplingParams and build_chain -------------------------------------------------------------------------------
def test_sampling_params_defaults_are_llama_cpps():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_penalty, p.repeat_last_n, p.frequency_penalty, p.presence_penalty) == (1.0, 64, 0.0, 0.0)
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta, p.top_n_sigma) == (0, 5.0, 0.1, -1.0)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.0, 1.75, 2, 64)
    assert list(p.dry_sequence_breakers) == ["\n", ":", "\"", "*"]
    assert (p.xtc_probability, p.xtc_threshold) == (0.0, 0.1)
    with pytest.raises(GGFlowError, match="repeat_penalty"):
        SamplingParams(repeat_penalty=0.0)


def names(chain: SamplerChain) -> list[str]:
    return [s.name for s in chain.samplers]


def test_default_chain_is_llama_cpps_with_the_no_op_stages_left_out():
    assert names(build_chain(SamplingParams())) == ["top_k", "top_p", "min_p", "temp_ext", "dist"]
    everything = SamplingParams(repeat_penalty=1.1, dry_multiplier=0.8, top_n_sigma=1.5, typical_p=0.9,
                                xtc_probability=0.5, logit_bias={3: -1.0})
    assert names(build_chain(everything, vocab=PiecesVocab(["\n", ":", "\"", "*", "a"]))) == [
        "logit_bias", "penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temp_ext",
        "dist"]
    assert DEFAULT_SAMPLER_ORDER[0] == "penalties" and DEFAULT_SAMPLER_ORDER[-1] == "temperature"


def test_zero_temperature_is_greedy():
    chain = build_chain(SamplingParams(temperature=0.0, seed=1))
    assert names(chain)[-1] == "greedy" and "temp_ext" not in names(chain)
    logits = random_logits(VOCAB, 16)
    assert all(chain.sample(logits) == int(np.argmax(logits)) for _ in range(3))


def test_mirostat_replaces_the_truncation_chain():
    assert names(build_chain(SamplingParams(mirostat=1), vocab_size=100)) == ["temp", "mirostat"]
    assert build_chain(SamplingParams(mirostat=1), vocab_size=100).samplers[1].n_vocab == 100
    assert names(build_chain(SamplingParams(mirostat=2, logit_bias={1: 1.0}))) == ["logit_bias", "temp", "mirostat_v2"]


def test_samplers_list_sets_the_order_and_takes_llama_cpp_spellings():
    chain = build_chain(SamplingParams(samplers=["temp", "min-p", "top_k", ("top_n_sigma", {"n": 2.0})]))
    assert names(chain) == ["temp_ext", "min_p", "top_k", "top_n_sigma", "dist"]
    with pytest.raises(UnknownNameError, match="no_such_stage"):
        build_chain(SamplingParams(samplers=["top_k", "no_such_stage"]))


def test_default_chain_matches_llama_cpps_draws_for_a_seed():
    logits = random_logits(VOCAB, 17)
    chain, ref = build_chain(SamplingParams(seed=42)), ReferenceMT19937(42)
    top = np.argsort(-logits, kind="stable")[:40]                   # top_k 40, sorted
    probs = softmax(logits[top])
    n = int(np.searchsorted(np.cumsum(probs), 0.95)) + 1             # top_p 0.95
    kept = top[:n][logits[top[:n]] >= logits.max() + np.log(0.05)]  # min_p 0.05
    for _ in range(10):
        assert chain.sample(logits) == kept[reference_dist_pick(logits[kept] / np.float32(0.8), ref)]


# -- samplers written elsewhere -----------------------------------------------------------------------------------
class PreferEven(SamplerBase):
    """Masks odd token ids: a reshaping sampler with a parameter."""

    name = "test_prefer_even"

    def __init__(self, keep_odd: int = -1):
        self.keep_odd = keep_odd

    def apply(self, cur):
        odd = (cur.ids % 2 == 1) & (cur.ids != self.keep_odd)
        cur.logits = np.where(odd, np.float32(-np.inf), cur.logits)


class PickLowestId(SamplerBase):
    name = "test_pick_lowest_id"
    selects = True

    def apply(self, cur):
        cur.selected = int(np.argmin(np.where(np.isfinite(cur.logits), cur.ids, np.iinfo(np.int32).max)))


class BanToken(SamplerBase):
    """Reads its option from SamplingParams (the token logit_bias sends to -inf), as the built-ins do."""

    name = "test_ban_token"

    def __init__(self, token: int):
        self.token = token

    @classmethod
    def from_params(cls, params, vocab_size=None, vocab=None):
        banned = [t for t, b in params.logit_bias.items() if b == -np.inf]
        return cls(banned[0]) if banned else None

    def apply(self, cur):
        cur.logits = np.where(cur.ids == self.token, np.float32(-np.inf), cur.logits)


class SamplerPlugin:
    @hookimpl
    def register_samplers(self, register):
        register(PreferEven)
        register(PickLowestId)
        register(BanToken)


@pytest.fixture
def plugin():
    manager, obj = get_plugin_manager(), SamplerPlugin()
    manager.register(obj, "test-samplers")
    yield obj
    manager.unregister(obj)


def test_a_sampler_registered_through_the_hook_is_usable_by_name(plugin):
    assert isinstance(make_sampler("test_prefer_even", keep_odd=3), PreferEven)
    chain = build_chain(SamplingParams(seed=2, samplers=[*DEFAULT_SAMPLER_ORDER, "test_prefer_even"]))
    assert names(chain) == ["top_k", "top_p", "min_p", "temp_ext", "test_prefer_even", "dist"]
    logits = random_logits(1000, 19, scale=0.1)
    assert all(chain.sample(logits) % 2 == 0 for _ in range(50))
    picked = build_chain(SamplingParams(samplers=["top_k", ("test_prefer_even", {"keep_odd": 1}),
                                                  "test_pick_lowest_id"], top_k=1000))
    assert names(picked)[-1] == "test_pick_lowest_id"  # it selects: no dist after it
    assert picked.sample(logits) == 0


def test_a_plugin_sampler_builds_itself_from_the_params_or_leaves_itself_out(plugin):
    order = ["test_ban_token", "greedy"]
    assert names(build_chain(SamplingParams(samplers=order))) == ["greedy"]
    chain = build_chain(SamplingParams(samplers=order, logit_bias={7: 1.0, 2: -np.inf}))
    assert names(chain) == ["logit_bias", "test_ban_token", "greedy"] and chain.samplers[1].token == 2
    assert chain.sample(np.array([0, 1, 9, 3], dtype=np.float32)) == 3


def test_a_bare_stage_name_whose_sampler_needs_parameters_says_so():
    with pytest.raises(GGFlowError, match="'logits_processor' does not take these parameters"):
        build_chain(SamplingParams(samplers=["top_k", "logits_processor"]))


def test_each_built_in_stage_leaves_itself_out_when_its_params_switch_it_off():
    from ggflow.core.sampling_params import sampler_from_params

    off = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, top_n_sigma=-1.0,
                         xtc_probability=0.0, dry_multiplier=0.0, repeat_penalty=1.0)
    for name in ("penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temp_ext",
                 "logit_bias"):
        assert sampler_from_params(name, off) is None, name
    assert sampler_from_params("top_k", SamplingParams(top_k=7)).k == 7
    assert sampler_from_params("dist", SamplingParams(seed=9)).seed == 9


def test_cli_sampling_flags_take_their_defaults_and_help_from_sampling_params():
    import argparse
    import dataclasses

    from ggflow.cli.common import SAMPLING_FLAGS, add_sampling_options, sampling_params

    parser = argparse.ArgumentParser()
    add_sampling_options(parser)
    assert sampling_params(parser.parse_args([])) == SamplingParams()
    docs = {f.name: f.metadata["doc"] for f in dataclasses.fields(SamplingParams)}
    helps = {a.dest: a.help for a in parser._actions}
    assert all(helps[name].startswith(docs[name]) for name in SAMPLING_FLAGS.values())
    chosen = sampling_params(parser.parse_args(["--temp", "0.3", "--mirostat-ent", "4", "--samplers", "top_k;temp"]))
    assert (chosen.temperature, chosen.mirostat_tau, chosen.samplers) == (0.3, 4.0, ["top_k", "temp"])


def test_logits_processor_sees_history_and_full_logits():
    seen = []

    def ban_repeats(token_ids, logits):
        seen.append((list(token_ids), logits.shape))
        out = logits.copy()
        out[token_ids] = -np.inf
        return out

    chain = SamplerChain([LogitsProcessorSampler(ban_repeats), make_sampler("greedy")])
    logits = np.array([5.0, 4.0, 3.0, 2.0], dtype=np.float32)
    assert [chain.sample(logits) for _ in range(3)] == [0, 1, 2]
    assert seen[-1] == ([0, 1], (4,))
    chain.reset()
    assert chain.sample(logits) == 0
