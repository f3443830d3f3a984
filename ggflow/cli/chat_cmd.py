"""``ggflow chat``: an interactive chat using the model's own chat template; scriptable through stdin.

Each line read is a user turn; the reply streams to stdout. ``/reset`` forgets the conversation, ``/exit``
(or end of input) quits. With stdin not a terminal, no prompts are printed, so
``printf 'Hi\\nWhat is 2+2?\\n' | ggflow chat --temp 0`` prints just the replies, one per turn.
When the conversation outgrows the context, the oldest turns are dropped (the system prompt stays), and
stderr says so.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ggflow.api.arguments import cli_type
from ggflow.cli.common import add_model_options, add_sampling_options, load_llm, sampling_params
from ggflow.cli.compile_notice import end_progress
from ggflow.cli.run_cmd import UNTIL_DONE, max_tokens


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model, using its chat template",
                                   description="Interactive chat: one user turn per input line.")
    add_model_options(parser)
    parser.add_argument("-s", "--system", default=None, help="system prompt")
    parser.add_argument("-n", "--n-predict", type=cli_type("max_tokens", int),
                        default=256, help="most tokens per reply; -1: until end of text or a full context (default 256)")
    add_sampling_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    llm = load_llm(args)
    interactive = sys.stdin.isatty()
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    sampling = sampling_params(args)
    while True:
        if interactive:
            end_progress()
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            messages = list(start)
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        if not fit_context(llm, messages, len(start), reply_room(args.n_predict, llm.n_ctx)):
            messages.pop()
            continue
        reply = []
        for chunk in llm.create_chat_completion(messages, max_tokens(args.n_predict, llm), stream=True,
                                                sampling=sampling):
            piece = chunk["choices"][0]["delta"].get("content", "")
            end_progress()
            reply.append(piece)
            print(piece, end="", flush=True)
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(reply)})


def reply_room(n_predict: int, n_ctx: int) -> int:
    """Context cells kept free for the reply: -n, at most half the context (a quarter for -n -1)."""
    return n_ctx // 4 if n_predict == UNTIL_DONE else min(n_predict, n_ctx // 2)


def chat_prompt_tokens(llm, messages: list[dict]) -> int:
    return len(llm.tokenize(llm.chat_template().render(messages, add_generation_prompt=True), parse_special=True))


def fit_context(llm, messages: list[dict], n_keep: int, room: int) -> bool:
    """Drop the oldest turns after the first n_keep messages until the prompt leaves `room` cells for the
    reply; False (said on stderr) when even the newest message alone does not fit."""
    dropped = 0
    while chat_prompt_tokens(llm, messages) + room > llm.n_ctx:
        if len(messages) - n_keep <= 1:
            print(f"ggflow chat: this message does not fit the {llm.n_ctx}-token context with room for a "
                  f"reply; skipped it (a larger -c, or a smaller -n)", file=sys.stderr)
            return False
        # The oldest turn: a user message and the reply that followed it.
        del messages[n_keep:n_keep + (2 if len(messages) - n_keep > 2 else 1)]
        dropped += 1
    if dropped:
        print(f"ggflow chat: the conversation outgrew the {llm.n_ctx}-token context; dropped the oldest "
              f"{dropped} turn{'s' if dropped > 1 else ''}{' (the system prompt is kept)' if n_keep else ''}",
              file=sys.stderr)
    return True
