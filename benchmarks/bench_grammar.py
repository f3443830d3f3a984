"""What a grammar costs per token: llguidance's mask plus ggflow's masking, and end-to-end tokens/s
with a JSON schema against unconstrained generation, interleaved in one run on the default model.

    python benchmarks/bench_grammar.py [-n 64] [-r 5] [-t 1]

Prints medians over the repetitions. Targets (issue 12): under 1 ms per token for the constraint, and
constrained generation at least 0.8x the unconstrained tokens/s.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ggflow.api import LLM
from ggflow.core.sampling import TokenDataArray
from ggflow.structured import Grammar, GrammarSampler

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "age": {"type": "integer"}}, "required": ["name", "tags", "age"], "additionalProperties": False}
PROMPT = "Write a JSON record about a made-up person, with a name, a list of tags and an age:"


def constraint_cost(llm: LLM, tokens: list[int]) -> tuple[float, float]:
    """Median ms per token of (mask + apply to 49k logits) and of accept, replaying generated tokens."""
    sampler = GrammarSampler(Grammar.from_json_schema(SCHEMA), llm.vocab)
    logits = np.random.default_rng(0).normal(size=llm.vocab.n_vocab).astype(np.float32)
    masks, accepts = [], []
    for tid in tokens:
        cur = TokenDataArray.from_logits(logits)
        t0 = time.perf_counter()
        sampler.apply(cur)
        t1 = time.perf_counter()
        sampler.accept(tid)
        t2 = time.perf_counter()
        masks.append(t1 - t0)
        accepts.append(t2 - t1)
    return 1e3 * statistics.median(masks), 1e3 * statistics.median(accepts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=64, help="tokens per generation")
    ap.add_argument("-r", type=int, default=5, help="repetitions (interleaved)")
    ap.add_argument("-t", type=int, default=1, help="threads")
    args = ap.parse_args()
    llm = LLM(n_ctx=512, n_threads=args.t, backend="cpu")
    grammar = Grammar.from_json_schema(SCHEMA)
    rates: dict[str, list[float]] = {"free": [], "json_schema": []}
    constrained_tokens: list[int] = []
    for _ in range(args.r + 1):                       # the first round warms up
        for kind in rates:
            llm.reset()
            kw = {"grammar": grammar} if kind == "json_schema" else {}
            out = llm.generate(PROMPT, max_tokens=args.n, temperature=0, **kw)
            rates[kind].append(out.timings.predicted_per_second)
            if kind == "json_schema":
                constrained_tokens = out.tokens
    for kind in rates:
        rates[kind] = rates[kind][1:]
    mask_ms, accept_ms = constraint_cost(llm, [t for t in constrained_tokens if not llm.vocab.is_eog(t)])
    free, json_rate = statistics.median(rates["free"]), statistics.median(rates["json_schema"])
    print(f"vocabulary: {llm.vocab.n_vocab} tokens; {args.n} tokens per generation, {args.r} runs, {args.t} thread(s)")
    print(f"constraint per token: mask {mask_ms:.3f} ms + accept {accept_ms:.3f} ms = {mask_ms + accept_ms:.3f} ms")
    print(f"unconstrained: {free:.1f} tok/s; json_schema: {json_rate:.1f} tok/s; ratio {json_rate / free:.2f}")


if __name__ == "__main__":
    main()
