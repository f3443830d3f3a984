"""Fuzz the GGUF loader: N hostile mutants of the tiny shared models and vocab files, counted per strategy.

    python benchmarks/fuzz_gguf.py 5000                 # 5000 generic mutants + every type confusion
    python benchmarks/fuzz_gguf.py 20000 --confusions 0 # generic only

Each mutant is loaded and run (tokenize, two decoded tokens, a chat render; a vocab file: tokenize and
detokenize) under a time budget. A case ends "ran", "clean" (a ggflow.errors exception) or "other"
(any other exception, or past the budget): every "other" is a loader bug, printed with its mutant's
(seed, strategy, case) so it can be replayed with tests/gguf_fuzz.py. The mutants come from
tests/gguf_fuzz.py (see there for the strategies); they are seeded, so a run is reproducible.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import gguf_fuzz as fz  # noqa: E402

VOCAB_SEEDS_FAST = ("llama-spm", "phi-3", "deepseek-coder", "gpt-2", "mpt", "starcoder")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, help="number of generic (container-damaging) mutants")
    ap.add_argument("--confusions", type=int, default=-1,
                    help="type-confusion cases to run (-1: all of them: every key x every other type)")
    ap.add_argument("--budget", type=float, default=10.0, help="seconds one case may take")
    ap.add_argument("--vocab-share", type=float, default=0.15, help="fraction of generic cases on vocab files")
    args = ap.parse_args()

    models = fz.MODEL_SEEDS
    vocabs = [p for p in fz.VOCAB_SEEDS if any(name in p.name for name in VOCAB_SEEDS_FAST)]
    if not models:
        print(f"no seed models under {fz.SHARED}/models", file=sys.stderr)
        return 2
    tallies: dict[str, fz.Tally] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutant.gguf"
        # warm up (numba compiles the kernels on first use; not a case)
        fz.run_case(models[0].read_bytes(), path, budget_s=600)
        for case in range(args.n):
            vocab_case = vocabs and (case % 100) < 100 * args.vocab_share
            seed = vocabs[case % len(vocabs)] if vocab_case else models[case % len(models)]
            names = [s for s in fz.GENERIC if not (vocab_case and s in fz.NEEDS_TENSORS)]
            strategy = names[(case // 7) % len(names)]
            try:
                data = fz.mutate(seed, strategy, case)
            except (ValueError, IndexError, KeyError, TypeError, AttributeError):
                continue   # the strategy does not apply to this seed (e.g. no such key)
            outcome = fz.run_case(data, path, vocab_only=bool(vocab_case), budget_s=args.budget)
            tallies.setdefault(strategy, fz.Tally()).add(outcome, f"{seed.name}/{strategy}/{case}")
        confusions = ((seed, key, name, img) for seed in models for key, name, img in
                      fz.type_confusions(fz.read_image(seed)))
        if args.confusions >= 0:
            confusions = itertools.islice(confusions, args.confusions)
        for seed, key, name, img in confusions:
            outcome = fz.run_case(fz.serialize(img), path, budget_s=args.budget)
            tallies.setdefault("type_confusion", fz.Tally()).add(outcome, f"{seed.name}/{key}={name}")
    report(tallies, time.perf_counter() - start)
    return 1 if any(t.other for t in tallies.values()) else 0


def report(tallies: dict[str, fz.Tally], seconds: float) -> None:
    print(f"{'strategy':<20} {'cases':>7} {'clean':>7} {'ran':>7} {'other':>7}")
    total = fz.Tally()
    for name, t in tallies.items():
        print(f"{name:<20} {t.cases:>7} {t.clean:>7} {t.ran:>7} {t.other:>7}")
        for field in ("cases", "clean", "ran", "other"):
            setattr(total, field, getattr(total, field) + getattr(t, field))
    print(f"{'total':<20} {total.cases:>7} {total.clean:>7} {total.ran:>7} {total.other:>7}   ({seconds:.0f} s)")
    for name, t in tallies.items():
        for example in t.examples:
            print(f"  other: {example}")


if __name__ == "__main__":
    sys.exit(main())
