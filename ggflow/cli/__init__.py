"""The ``ggflow`` command. Each subcommand is one module here with ``add_parser(subparsers)``.

To add a command, write ``ggflow/cli/<name>_cmd.py`` defining ``add_parser(subparsers)``, which adds
its parser and sets ``func=run`` (``run(args) -> int``), and list the module in ``COMMANDS``. Keep
heavy imports (numba kernels, models) inside ``run`` so ``ggflow --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from ggflow import __version__
from ggflow.errors import GGFlowError

COMMANDS = (
    "ggflow.cli.run_cmd",
    "ggflow.cli.chat_cmd",
    "ggflow.cli.info_cmd",
    "ggflow.cli.bench_cmd",
    "ggflow.cli.quantize_cmd",
    "ggflow.cli.plugins_cmd",
    "ggflow.cli.serve_cmd",
)

EXIT_USER_ERROR = 2  # argparse uses 2 for usage errors too


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggflow", description="Run GGUF language models in Python.")
    parser.add_argument("--version", action="version", version=f"ggflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse has printed what to print
        return exc.code if isinstance(exc.code, int) else EXIT_USER_ERROR
    try:
        return int(args.func(args) or 0)
    except GGFlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ggflow plugins | head`: the reader left, nothing is wrong
        # Point stdout at devnull so the interpreter's final flush doesn't raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
