"""``ggflow run``: generate a completion of a prompt, streamed to stdout, with llama.cpp-style timings."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ggflow.api.arguments import cli_type
from ggflow.cli.common import add_model_options, add_sampling_options, load_llm, sampling_params
from ggflow.cli.compile_notice import compile_seconds, end_progress
from ggflow.errors import GGFlowError

UNTIL_DONE = -1  # -n -1, as llama.cpp: until the end of text or a full context


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("run", help="generate text from a prompt",
                                   description="Complete a prompt with a GGUF model and print timings.")
    add_model_options(parser)
    parser.add_argument("-p", "--prompt", default=None, help="prompt text")
    parser.add_argument("--prompt-ids", default=None, help="prompt as comma-separated token ids")
    parser.add_argument("-n", "--n-predict", type=cli_type("max_tokens", int),
                        default=64, help="tokens to generate; -1: until end of text or a full context (default 64)")
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


def max_tokens(n_predict: int, llm) -> int:
    return llm.n_ctx if n_predict == UNTIL_DONE else n_predict


def run(args: argparse.Namespace) -> int:
    if args.prompt is None and args.prompt_ids is None:
        args.prompt = "Once upon a time"
    prompt = parse_ids(args.prompt_ids) if args.prompt_ids is not None else args.prompt
    llm = load_llm(args)
    gen = llm.generate(prompt, max_tokens(args.n_predict, llm), stop=args.stop, stream=True,
                       sampling=sampling_params(args))
    echo = "" if args.json or not isinstance(prompt, str) else prompt
    compiled_before = compile_seconds()
    compiled_in_prompt = None
    for piece in gen:
        if compiled_in_prompt is None:  # the first piece comes once the prompt is evaluated
            compiled_in_prompt = compile_seconds() - compiled_before
            end_progress()
        if not args.json:
            print(echo + piece, end="", flush=True)
            echo = ""
    end_progress()
    result = gen.result
    compiled = compile_seconds() - compiled_before
    compiled_in_prompt = compiled if compiled_in_prompt is None else compiled_in_prompt
    t = result.timings
    if not args.json:
        print(echo)
    print(f"prompt eval: {t.prompt_n} tokens in {t.prompt_ms:.1f} ms ({t.prompt_per_second:.1f} tokens/s)"
          f"{f', {t.cached_n} reused from the cache' if t.cached_n else ''}{_compiling(compiled_in_prompt)}",
          file=sys.stderr)
    print(f"eval:        {t.predicted_n} tokens in {t.predicted_ms:.1f} ms ({t.predicted_per_second:.1f} tokens/s)"
          f", finish: {result.finish_reason}{_compiling(compiled - compiled_in_prompt)}", file=sys.stderr)
    if args.verbose:
        print_schedule(llm.context)
    if args.json:
        report = {"prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": result.text,
                  "finish_reason": result.finish_reason, "timings": t.as_dict()}
        if args.verbose:
            report["scheduler"] = llm.context.scheduler.stats.as_dict()
        print(json.dumps(report))
    return 0


def _compiling(seconds: float) -> str:
    return f" (of which {1e3 * seconds:.0f} ms compiling kernels, once)" if seconds >= 0.0005 else ""


def print_schedule(ctx: Any) -> None:
    """The backends, where the KV cache lives, and the scheduler's stats (splits, copies, bytes)."""
    print(f"backends:    {', '.join(b.name for b in ctx.backends)}; KV cache on {ctx.memory_backend.name}",
          file=sys.stderr)
    print(ctx.scheduler.stats.summary(), file=sys.stderr)
    for i, split in enumerate(ctx.scheduler.splits):
        print(f"split {i:3d}:   {split.backend.name}, {len(split.nodes)} node(s) from {split.nodes[0].name or split.nodes[0].op}: "
              f"{split.reason}", file=sys.stderr)
