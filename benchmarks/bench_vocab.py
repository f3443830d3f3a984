"""Tokenizing speed: 10k characters of multilingual text, on SmolLM2's byte-level BPE and llama's SPM.

Both should take well under half a second (about 0.01 s for the BPE, 0.03 s for the SPM on an idle core).
    python benchmarks/bench_vocab.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ggflow.api import default_model_path  # noqa: E402
from ggflow.core.vocab import Vocab  # noqa: E402
from tests.test_vocab import MULTILINGUAL  # noqa: E402

BUDGET_S = 0.5  # what test_vocab asserted before timing moved here


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5, help="runs per vocabulary; the fastest is reported")
    args = ap.parse_args()
    text = (MULTILINGUAL * (10_000 // len(MULTILINGUAL) + 1))[:10_000]
    vocabs = {"SmolLM2 (gpt2 BPE)": default_model_path(),
              "llama SPM": ROOT.parent / "shared" / "vocab" / "ggml-vocab-llama-spm.gguf"}
    for name, path in vocabs.items():
        if not Path(path).exists():
            print(f"{name}: {path} not found, skipped")
            continue
        vocab = Vocab.from_file(path)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            ids = vocab.tokenize(text, add_special=False)
            times.append(time.perf_counter() - start)
        assert vocab.detokenize(ids) == text  # a fast wrong answer is no answer
        best = min(times)
        print(f"{name}: {best:.3f} s for {len(text)} characters -> {len(ids)} tokens "
              f"(best of {args.repeat}; {'within' if best < BUDGET_S else 'OVER'} the {BUDGET_S} s budget)")


if __name__ == "__main__":
    main()
