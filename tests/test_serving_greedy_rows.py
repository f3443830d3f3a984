"""The engine's batched greedy pick: one argmax over the rows gives the token each slot's chain would sample."""
from __future__ import annotations

import numpy as np
import pytest

from ggflow.core.sampling import SamplerChain, SamplingParams, build_chain, make_sampler
from ggflow.generation.greedy_rows import NO_TOKEN, argmax_plan, argmax_rows

N_VOCAB = 4096

ARGMAX_CHAINS = {
    "default greedy": SamplingParams(temperature=0),
    "ignore_eos bias": SamplingParams(temperature=0, logit_bias={2: float("-inf"), 7: float("-inf")}),
    "positive bias": SamplingParams(temperature=0, logit_bias={11: 3.5, 12: -1.0}),
    "top_n_sigma": SamplingParams(temperature=0, top_n_sigma=1.5, top_k=0, top_p=0.5),
    "no truncation": SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0),
}

CHAIN_SAMPLES = {
    "repeat penalty": SamplingParams(temperature=0, repeat_penalty=1.3),
    "typical": SamplingParams(temperature=0, typical_p=0.5),
    "xtc": SamplingParams(temperature=0, xtc_probability=1.0, xtc_threshold=0.01),
    "dist": SamplingParams(temperature=0.8, seed=3),
    "bias after top_k": SamplingParams(temperature=0, samplers=["top_k", ("logit_bias", {"bias": {5: 9.0}})]),
}


def chain_token(params: SamplingParams, row: np.ndarray) -> int:
    return build_chain(params, vocab_size=N_VOCAB).sample(row.copy())


def rows_with_ties(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.standard_normal((n, N_VOCAB)).astype(np.float32) * 3
    rows[0, [9, 40, 3000]] = rows[0].max() + 1.0          # a tie at the top: the chain decides
    rows[1, 11] = rows[1].max() + 0.1                      # the top, unless a bias changes it
    rows[2, 7] = rows[2].max() + 2.0                       # the top unless banned (ignore_eos)
    rows[3, 11] = rows[3].max() - 1.0                      # second, unless biased up by 3.5
    return rows


@pytest.mark.parametrize("name", ARGMAX_CHAINS)
def test_argmax_rows_pick_the_chains_token(name):
    params = ARGMAX_CHAINS[name]
    rows = rows_with_ties(np.random.default_rng(0), 6)
    plan = argmax_plan(build_chain(params, vocab_size=N_VOCAB))
    assert plan is not None
    picked = argmax_rows(rows.copy(), [plan] * len(rows))
    assert picked[0] == NO_TOKEN and (picked[1:] != NO_TOKEN).all()
    chain_picks = [chain_token(params, row) for row in rows]
    assert picked[1:].tolist() == chain_picks[1:]
    assert (picked[2] == 7) == (7 not in params.logit_bias)    # the biases went in before the argmax
    assert (picked[3] == 11) == (11 in params.logit_bias)


@pytest.mark.parametrize("name", CHAIN_SAMPLES)
def test_chains_that_are_no_argmax_have_no_plan(name):
    assert argmax_plan(build_chain(CHAIN_SAMPLES[name], vocab_size=N_VOCAB)) is None


def test_a_grammar_or_other_sampler_in_front_means_no_plan():
    chain = build_chain(SamplingParams(temperature=0), vocab_size=N_VOCAB)
    chain.samplers.insert(0, make_sampler("temp", t=0.5))
    assert argmax_plan(chain) is None
    assert argmax_plan(SamplerChain()) is None


def test_a_tie_at_the_top_is_left_to_the_chain():
    """Which of the tied tops a chain picks depends on its stages (top_p's partition order): not argmax's."""
    plan = argmax_plan(build_chain(SamplingParams(temperature=0, top_k=0), vocab_size=N_VOCAB))
    rows = np.zeros((2, N_VOCAB), np.float32)
    rows[0, [5, 6]] = 1.0
    rows[1, 6] = 1.0
    assert argmax_rows(rows, [plan, plan]).tolist() == [NO_TOKEN, 6]


def test_a_row_without_a_finite_top_is_left_to_the_chain():
    plan = argmax_plan(build_chain(SamplingParams(temperature=0), vocab_size=N_VOCAB))
    rows = np.zeros((2, N_VOCAB), np.float32)
    rows[0, 3] = np.nan
    rows[1, 3] = np.inf
    assert argmax_rows(rows, [plan, plan]).tolist() == [NO_TOKEN, NO_TOKEN]
