"""``ggflow run``: generate a completion of a prompt, streamed to stdout, with llama.cpp-style timings."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ggflow.cli.common import add_model_options, add_sampling_options, load_llm, sampling_params
from ggflow.errors import GGFlowError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("run", help="generate text from a prompt",
                                   description="Complete a prompt with a GGUF model and print timings.")
    add_model_options(parser)
    parser.add_argument("-p", "--prompt", default=None, help="prompt text")
    parser.add_argument("--prompt-ids", default=None, help="prompt as comma-separated token ids")
    parser.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on the last line: prompt_tokens, tokens, text, timings")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print where the graph ran: backends, KV cache, splits and copies per compute")
    add_sampling_options(parser)
    parser.set_defaults(func=run)


def parse_ids(spec: str) -> list[int]:
    try:
        return [int(x) for x in spec.replace(" ", "").split(",") if x]
    except ValueError:
        raise GGFlowError(f"--prompt-ids must be comma-separated integers, got {spec!r}") from None


def run(args: argparse.Namespace) -> int:
    if args.prompt is None and args.prompt_ids is None:
        args.prompt = "Once upon a time"
    llm = load_llm(args)
    prompt = parse_ids(args.prompt_ids) if args.prompt_ids is not None else args.prompt
    gen = llm.generate(prompt, args.n_predict, stop=args.stop, stream=True, sampling=sampling_params(args))
    if isinstance(prompt, str) and not args.json:
        print(prompt, end="", flush=True)
    for piece in gen:
        if not args.json:
            print(piece, end="", flush=True)
    result = gen.result
    t = result.timings
    if not args.json:
        print()
    print(f"prompt eval: {t.prompt_n} tokens in {t.prompt_ms:.1f} ms ({t.prompt_per_second:.1f} tokens/s)"
          f"{f', {t.cached_n} reused from the cache' if t.cached_n else ''}", file=sys.stderr)
    print(f"eval:        {t.predicted_n} tokens in {t.predicted_ms:.1f} ms ({t.predicted_per_second:.1f} tokens/s)"
          f", finish: {result.finish_reason}", file=sys.stderr)
    if args.verbose:
        print_schedule(llm.context)
    if args.json:
        report = {"prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": result.text,
                  "finish_reason": result.finish_reason, "timings": t.as_dict()}
        if args.verbose:
            report["scheduler"] = llm.context.scheduler.stats.as_dict()
        print(json.dumps(report))
    return 0


def print_schedule(ctx: Any) -> None:
    """The backends, where the KV cache lives, and the scheduler's stats (splits, copies, bytes)."""
    print(f"backends:    {', '.join(b.name for b in ctx.backends)}; KV cache on {ctx.memory_backend.name}",
          file=sys.stderr)
    print(ctx.scheduler.stats.summary(), file=sys.stderr)
