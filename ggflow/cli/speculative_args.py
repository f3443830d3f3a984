"""``ggflow serve``'s speculative decoding options, under llama-server's names (and its older ones).

    --spec-type ngram               prompt lookup (LlamaPromptLookupDecoding): drafts copy the context
    -md/--model-draft small.gguf    a draft model with its own KV cache (llama.cpp's draft-simple)
    --draft-max N / --draft-min N / --draft-p-min P / --spec-ngram-size-n N
"""
from __future__ import annotations

import argparse
from typing import Any

from ggflow.cli.args import UsageError, existing_file, int_at_least
from ggflow.generation.speculative import MAX_DRAFT

SPEC_TYPES = ("none", "ngram", "ngram-simple", "draft-simple")
NGRAM_DEFAULT_MAX = 10   # llama-cpp-python's num_pred_tokens
DRAFT_DEFAULT_MAX = 3    # llama.cpp's draft n_max


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; accepted: a probability in [0, 1]") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is out of range; accepted: a probability in [0, 1]")
    return value


def add_speculative_arguments(parser: Any) -> None:
    spec = parser.add_argument_group("speculative decoding (docs/serving.md)")
    spec.add_argument("--spec-type", choices=SPEC_TYPES, default=None,
                      help="ngram: draft by prompt lookup (copies of the context); ngram-simple: llama.cpp's "
                           "n-gram lookup; draft-simple: the draft model of --model-draft (the default when one "
                           "is given); none (default otherwise)")
    spec.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", default=None,
                      help="GGUF draft model (same vocabulary as the target) with its own KV cache")
    spec.add_argument("--draft-max", "--draft-n", "--spec-draft-n-max", dest="draft_max", type=int_at_least(1),
                      default=None, help=f"tokens drafted per step, at most (default: {DRAFT_DEFAULT_MAX} with a "
                                         f"draft model, {NGRAM_DEFAULT_MAX} with ngram; up to 1024)")
    spec.add_argument("--draft-min", "--draft-n-min", "--spec-draft-n-min", dest="draft_min", type=int_at_least(0),
                      default=0, help="a shorter draft of the draft model is not verified (default 0)")
    spec.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=probability, default=0.0,
                      help="the draft model stops drafting below this probability of its top token (default 0)")
    spec.add_argument("--spec-ngram-size-n", dest="ngram_size", type=int_at_least(1), default=2,
                      help="ngram: the longest n-gram looked up (default 2)")
    spec.add_argument("--spec-ngram-simple-size-n", dest="ngram_simple_n", type=int_at_least(1), default=12,
                      help="ngram-simple: the n-gram looked up (default 12)")
    spec.add_argument("--spec-ngram-simple-size-m", dest="ngram_simple_m", type=int_at_least(1), default=48,
                      help="ngram-simple: the most tokens drafted after it (default 48)")


def check_speculative_args(args: argparse.Namespace) -> str:
    """Refuse bad speculative options before anything loads; returns the speculation kind."""
    kind = args.spec_type or ("draft-simple" if args.model_draft else "none")
    if kind == "draft-simple" and not args.model_draft:
        raise UsageError("--spec-type draft-simple needs a draft model: -md/--model-draft PATH")
    if kind != "draft-simple" and args.model_draft:
        raise UsageError(f"-md/--model-draft {args.model_draft!r} is unused with --spec-type {kind}")
    if args.model_draft:
        existing_file(args.model_draft, "-md/--model-draft")
    if kind != "none" and getattr(args, "ray", False):
        raise UsageError("--ray replicas do not speculate yet: leave out --spec-type / --model-draft with --ray")
    if args.draft_max is not None and args.draft_max > MAX_DRAFT:
        raise UsageError(f"--draft-max {args.draft_max} is out of range; accepted: an integer in [1, {MAX_DRAFT}]")
    n_max = args.draft_max or DRAFT_DEFAULT_MAX
    if kind == "draft-simple" and args.draft_min > n_max:
        raise UsageError(f"--draft-min {args.draft_min} is out of range; accepted: at most --draft-max ({n_max})")
    for option, value in (("--spec-ngram-size-n", args.ngram_size), ("--spec-ngram-simple-size-n", args.ngram_simple_n),
                          ("--spec-ngram-simple-size-m", args.ngram_simple_m)):
        if value > MAX_DRAFT:
            raise UsageError(f"{option} {value} is out of range; accepted: an integer in [1, {MAX_DRAFT}]")
    return kind


def drafter_from_args(args: argparse.Namespace, context: Any, backends: Any = "auto") -> Any:
    """The engine's drafter for these (checked) options; None: no speculation."""
    from ggflow.generation.draft_model import load_draft_model
    from ggflow.generation.speculative import CallableDrafter, LlamaPromptLookupDecoding, NgramSimple

    kind = check_speculative_args(args)
    if kind == "ngram":
        lookup = LlamaPromptLookupDecoding(args.ngram_size, args.draft_max or NGRAM_DEFAULT_MAX)
        return CallableDrafter(lookup, context.model.vocab.n_vocab)
    if kind == "ngram-simple":
        return CallableDrafter(NgramSimple(args.ngram_simple_n, args.ngram_simple_m), context.model.vocab.n_vocab)
    if kind == "draft-simple":
        return load_draft_model(args.model_draft, context, n_max=args.draft_max or DRAFT_DEFAULT_MAX,
                                n_min=args.draft_min, p_min=args.draft_p_min, backends=backends,
                                n_threads=args.threads)
    return None
