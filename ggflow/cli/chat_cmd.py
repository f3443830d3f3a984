"""``ggflow chat``: an interactive chat using the model's own chat template; scriptable through stdin.

Each line read is a user turn; the reply streams to stdout. ``/reset`` forgets the conversation, ``/exit``
(or end of input) quits. With stdin not a terminal, no prompts are printed, so
``printf 'Hi\\nWhat is 2+2?\\n' | ggflow chat --temp 0`` prints just the replies, one per turn.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ggflow.cli.common import add_model_options, add_sampling_options, load_llm, sampling_params


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model, using its chat template",
                                   description="Interactive chat: one user turn per input line.")
    add_model_options(parser)
    parser.add_argument("-s", "--system", default=None, help="system prompt")
    parser.add_argument("-n", "--n-predict", type=int, default=256, help="most tokens per reply (default 256)")
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
        reply = []
        for chunk in llm.create_chat_completion(messages, args.n_predict, stream=True, sampling=sampling):
            piece = chunk["choices"][0]["delta"].get("content", "")
            reply.append(piece)
            print(piece, end="", flush=True)
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(reply)})
