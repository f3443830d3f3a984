"""The serving engine without HTTP: aggregate greedy tokens/s with 1 and 4 slots, per thread-choice mode.

    python benchmarks/bench_engine_threads.py [--rounds 3] [--tokens 96] [-t 2]

Runs the default model's Engine (4 slots) in one process and, round by round, switches how each product
big enough for threads picks its driver (cpu/thread_choice.py): "adaptive" (the default: per product size,
whichever its recent calls found faster), "parallel" (always), "serial" (always). Prints the medians over
the rounds. Results do not depend on the mode (every driver computes the same bits); only the time does.
"""
from __future__ import annotations

import argparse
import statistics
import time

from ggflow.api import default_model_path
from ggflow.backends_builtin.cpu import thread_choice
from ggflow.core.sampling_params import SamplingParams
from ggflow.generation.engine import Engine
from ggflow.generation.request import Request

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Three primary colors are"]
MODES = {"adaptive": thread_choice.ThreadChoice.parallel_now,
         "parallel": lambda choice: True,
         "serial": lambda choice: False}


def tokens_per_second(engine: Engine, n_requests: int, tokens: int) -> float:
    """n_requests greedy requests of `tokens` tokens each (end of generation banned), all at once."""
    count = [0]

    def on_event(event) -> None:
        count[0] += 1

    no_end = {t: float("-inf") for t in engine.vocab.special.eog}
    requests = [Request(engine.vocab.tokenize(p), on_event, max_tokens=tokens,
                        sampling=SamplingParams(temperature=0, logit_bias=no_end)) for p in PROMPTS[:n_requests]]
    start = time.perf_counter()
    for request in requests:
        engine.submit(request)
    engine.run_until_idle(timeout=300)
    return count[0] / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine.load(default_model_path(), n_ctx=4096, n_slots=4, n_threads=args.threads)
    runs: dict[tuple[str, int], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for mode, parallel_now in MODES.items():
                thread_choice.ThreadChoice.parallel_now = parallel_now
                for n in (1, 4):
                    tokens_per_second(engine, n, 8)   # this batch size's graphs built, its choices settled
                    runs.setdefault((mode, n), []).append(tokens_per_second(engine, n, args.tokens))
    finally:
        thread_choice.ThreadChoice.parallel_now = MODES["adaptive"]
    for (mode, n), values in sorted(runs.items()):
        print(f"{mode:9s} {n} slot{'s' if n > 1 else ' '}: {statistics.median(values):6.1f} tok/s  "
              f"({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
