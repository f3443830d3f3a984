"""Speculative decoding on an edit task: plain decoding, n-gram (prompt lookup) and a draft model, interleaved.

The model is asked (through its chat template, greedy) to rewrite a ~300-token code snippet with one change,
so most of its answer copies the prompt: the case prompt lookup is made for. Every round runs each variant
once, in an order that rotates from round to round, and each round's tokens/s are divided by that round's
plain figure; the medians of those ratios are printed (both sides of a ratio saw the same moment of a shared
host). Every variant must give the plain variant's tokens (greedy speculation is token-identical): a
difference is reported and makes the exit status 1.

    python benchmarks/bench_speculative.py [--model TARGET.gguf] [--draft DRAFT.gguf] [-t 2] [--rounds 5]
        [-n 320] [--ngram-max 10] [--draft-max 8] [--quantize-copies DIR]

``--model`` defaults to the default model (SmolLM2-135M-Instruct Q4_1), ``--draft`` to the target itself
(an upper bound on acceptance). The issue's draft setup is a Q4_0 copy drafting for a Q8_0 copy:
``--quantize-copies DIR`` writes both from ``--model`` (ggflow.quantize_model, kept for later runs) and uses
them. Figures need a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SNIPPET = '''import math
from dataclasses import dataclass


@dataclass
class Sample:
    """One measurement: a name, its values and the unit they are in."""
    name: str
    values: list[float]
    unit: str = "ms"


def mean(values: list[float]) -> float:
    """The arithmetic mean; an empty list has none."""
    if not values:
        raise ValueError("no values")
    return sum(values) / len(values)


def stdev(values: list[float]) -> float:
    """The sample standard deviation (n - 1 in the denominator)."""
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def summary(sample: Sample) -> str:
    """One line: name, mean, deviation and unit, for a report."""
    m, s = mean(sample.values), stdev(sample.values)
    return f"{sample.name}: {m:.2f} +- {s:.2f} {sample.unit} ({len(sample.values)} runs)"


def slowest(samples: list[Sample]) -> Sample:
    """The sample with the largest mean."""
    return max(samples, key=lambda s: mean(s.values))
'''
INSTRUCTION = ("Rename the function `stdev` to `std_dev` everywhere in this code. Reply with the complete "
               "code and nothing else.\n\n```python\n" + SNIPPET + "```")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target GGUF (default: the default model)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the target itself)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", "--max-tokens", type=int, default=320)
    ap.add_argument("--ngram-max", type=int, default=10, help="num_pred_tokens of the prompt lookup")
    ap.add_argument("--ngram-size", type=int, default=2, help="max_ngram_size of the prompt lookup")
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--quantize-copies", metavar="DIR", default=None,
                    help="target: a Q8_0 copy of --model, draft: a Q4_0 copy (written to DIR unless there)")
    args = ap.parse_args()
    if args.quantize_copies:
        args.model, args.draft = quantized_copies(args.model, Path(args.quantize_copies))

    import ggflow
    from ggflow.generation.draft_model import load_draft_model

    target = args.model or ggflow.default_model_path()
    common = dict(n_ctx=2048, n_threads=args.threads)
    variants = {
        "plain": ggflow.LLM(target, **common),
        "ngram": ggflow.LLM(target, **common, draft_model=ggflow.LlamaPromptLookupDecoding(
            max_ngram_size=args.ngram_size, num_pred_tokens=args.ngram_max)),
        "draft": ggflow.LLM(target, **common),
    }
    variants["draft"]._engine.drafter = load_draft_model(args.draft or target, variants["draft"].context,
                                                         n_max=args.draft_max, n_threads=args.threads)
    messages = [{"role": "user", "content": INSTRUCTION}]
    n_prompt = len(variants["plain"].tokenize(INSTRUCTION.encode()))
    print(f"target {Path(target).name}, draft {Path(args.draft or target).name}; snippet prompt {n_prompt} tokens; "
          f"{args.rounds} rounds of {args.max_tokens} tokens at most", flush=True)

    def run(name: str) -> dict:
        llm = variants[name]
        llm.reset()                    # every variant evaluates the whole prompt
        start = time.perf_counter()
        out = llm.create_chat_completion(messages=messages, max_tokens=args.max_tokens, temperature=0)
        out["wall_s"] = time.perf_counter() - start
        return out

    for name in variants:              # warm-up: kernels, graphs of each batch size the drafts use
        run(name)
    names = list(variants)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    status = 0
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        results = {n: run(n) for n in order}
        ref = results["plain"]["choices"][0]["message"]["content"]
        for n in names:
            res = results[n]
            if res["choices"][0]["message"]["content"] != ref:
                print(f"round {r}: {n}'s text differs from plain decoding's", flush=True)
                status = 1
            rows[n].append(res)
        line = "  ".join(f"{n} {results[n]['timings']['predicted_per_second']:6.1f} tok/s" for n in names)
        print(f"round {r}: {line}", flush=True)

    print("\n| variant | tokens | tokens/s (median) | x plain (median of per-round ratios) | drafted | accepted |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in names:
        tps = [x["timings"]["predicted_per_second"] for x in rows[n]]
        ratio = [x["timings"]["predicted_per_second"] / p["timings"]["predicted_per_second"]
                 for x, p in zip(rows[n], rows["plain"])]
        t = rows[n][-1]["timings"]
        print(f"| {n} | {t['predicted_n']} | {statistics.median(tps):.1f} | {statistics.median(ratio):.2f} | "
              f"{t.get('draft_n', 0)} | {t.get('draft_n_accepted', 0)} |")
    return status


def quantized_copies(model: str | None, where: Path) -> tuple[str, str]:
    import ggflow
    from ggflow.quantize_model import quantize_model

    source = model or ggflow.default_model_path()
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for ftype in ("Q8_0", "Q4_0"):
        path = where / f"{Path(source).stem}.{ftype.lower()}.gguf"
        if not path.exists():
            quantize_model(source, path, ftype, progress=False)
        out.append(str(path))
    return out[0], out[1]


if __name__ == "__main__":
    sys.exit(main())
