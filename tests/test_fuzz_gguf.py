"""Hostile GGUF files: every mutant either loads and runs, or raises a ggflow.errors error; none hangs.

A few hundred seeded mutants of the tiny shared models and vocab files (tests/gguf_fuzz.py), each
loaded and exercised (tokenize, two decoded tokens, a chat render) under a per-case time budget.
benchmarks/fuzz_gguf.py runs the same strategies by the tens of thousands.
"""
from __future__ import annotations

import pytest

from tests import gguf_fuzz as fz

# mutated weights overflow F16 and make NaNs: expected, and not what these tests look at
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")

CASES_PER_STRATEGY = 12
CONFUSIONS_PER_KEY = 4
BUDGET_S = 10.0   # per case; a tiny model takes ~30 ms (the first decode compiles: minutes in a fresh checkout)

MODELS = [p for p in fz.MODEL_SEEDS if p.name in ("tiny-llama-hs-q4_0.gguf", "tiny-gpt2-hs-q8_0.gguf",
                                                   "tiny-qwen2-hs-q8_0.gguf")]
VOCABS = [p for p in fz.VOCAB_SEEDS if p.name in ("ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf")]
assert len(MODELS) == 3 and len(VOCABS) == 2, "the seed models and vocabularies are missing from tests/data"


@pytest.fixture(scope="module")
def mutant_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "mutant.gguf"
    fz.run_case(MODELS[0].read_bytes(), path, budget_s=900)   # compile the kernels outside any case budget
    return path


def assert_all_clean(results: list[tuple[str, fz.Outcome]]) -> None:
    others = [f"{label}: {o.detail}" for label, o in results if o.kind == "other"]
    assert not others, f"{len(others)} of {len(results)} cases ended outside ggflow.errors:\n" + "\n".join(others[:10])
    assert any(o.kind == "clean" for _, o in results) or any(o.kind == "ran" for _, o in results)


@pytest.mark.parametrize("strategy", list(fz.GENERIC))
def test_generic_mutants_load_and_run_or_raise_a_ggflow_error(strategy, mutant_path):
    results = []
    for case in range(CASES_PER_STRATEGY):
        vocab_case = VOCABS and case % 4 == 3 and strategy not in fz.NEEDS_TENSORS
        seed = VOCABS[case % len(VOCABS)] if vocab_case else MODELS[case % len(MODELS)]
        data = fz.mutate(seed, strategy, case)
        results.append((f"{seed.name}/{strategy}/{case}",
                        fz.run_case(data, mutant_path, vocab_only=bool(vocab_case), budget_s=BUDGET_S)))
    assert_all_clean(results)


@pytest.mark.parametrize("seed", MODELS, ids=lambda p: p.name)
def test_every_key_given_another_type_loads_and_runs_or_raises_a_ggflow_error(seed, mutant_path):
    by_key: dict[str, list] = {}
    for key, name, img in fz.type_confusions(fz.read_image(seed)):
        by_key.setdefault(key, []).append((name, img))
    # a rotating sample: every key, ~CONFUSIONS_PER_KEY of the other types each (the benchmark runs them all)
    step = len(fz.CONFUSIONS) // CONFUSIONS_PER_KEY
    chosen = [(key, name, img) for i, key in enumerate(sorted(by_key))
              for j, (name, img) in enumerate(by_key[key]) if (i + j) % step == 0]
    results = [(f"{seed.name}/{key}={name}", fz.run_case(fz.serialize(img), mutant_path, budget_s=BUDGET_S))
               for key, name, img in chosen]
    assert {key for key, _, _ in chosen} == set(by_key)   # every key was confused
    assert_all_clean(results)


def test_the_mutator_is_deterministic():
    assert fz.mutate(MODELS[0], "byte_flips", 3) == fz.mutate(MODELS[0], "byte_flips", 3)
    assert fz.mutate(MODELS[0], "byte_flips", 3) != fz.mutate(MODELS[0], "byte_flips", 4)


def test_an_unmutated_image_serializes_back_to_a_file_that_runs(tmp_path):
    outcome = fz.run_case(fz.serialize(fz.read_image(MODELS[0])), tmp_path / "same.gguf", budget_s=900)
    assert outcome.kind == "ran", outcome.detail


# -- what the fuzzer found, pinned ---------------------------------------------------------------------
def test_q8_k_activations_of_an_infinite_row_give_ggmls_infinite_scale_not_a_zero_division():
    # tiny-llama-hs-q4_k_m.gguf/tensor_type_ids/1932: garbage weights overflowed an activation row to inf;
    # quantize_q8_K raised ZeroDivisionError (numba's Python division) where ggml computes 1 / -0.0 = -inf
    import numpy as np

    from ggflow.backends_builtin.cpu.products.qmm import act

    x = np.zeros((2, 256), np.float32)
    x[0, 3], x[1, :] = np.inf, 1.0
    xq, d, bsums = np.empty((2, 256), np.int16), np.empty((2, 1), np.float32), np.empty((2, 16), np.int32)
    act.quantize_q8_K(x, xq, d, bsums)
    assert d[0, 0] == -np.inf
    assert d[1, 0] == np.float32(1.0) / np.float32(-127.0) and (xq[1] == -127).all()   # finite rows as before
