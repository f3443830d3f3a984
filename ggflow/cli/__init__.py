"""The ``ggflow`` command. Each subcommand is one module here with ``add_parser(subparsers)``.

To add a command, write ``ggflow/cli/<name>_cmd.py`` defining ``add_parser(subparsers)``, which adds
its parser and sets ``func=run`` (``run(args) -> int``), and list the module in ``COMMANDS``. Keep
heavy imports (numba kernels, models) inside ``run`` so ``ggflow --help`` stays fast. A command that
runs kernels sets ``compiles_kernels=True`` (``add_model_options`` does) so first-run compiles are
announced. Values are checked by the types in ``args.py``: a bad one is one line and exit 2.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import ContextManager, Sequence

from ggflow import __version__
from ggflow.cli.args import Parser
from ggflow.errors import GGFlowError

COMMANDS = (
    "ggflow.cli.run_cmd",
    "ggflow.cli.chat_cmd",
    "ggflow.cli.info_cmd",
    "ggflow.cli.bench_cmd",
    "ggflow.cli.quantize_cmd",
    "ggflow.cli.imatrix_cmd",
    "ggflow.cli.convert_cmd",
    "ggflow.cli.plugins_cmd",
    "ggflow.cli.warmup_cmd",
    "ggflow.cli.serve_cmd",
)

EXIT_USER_ERROR = 2  # argparse uses 2 for usage errors too
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C


def build_parser() -> Parser:
    parser = Parser(prog="ggflow", description="Run GGUF language models in Python.")
    parser.add_argument("--version", action="version", version=f"ggflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        with _announcing_compiles(args):
            return int(args.func(args) or 0)
    except SystemExit as exc:  # --help, --version: argparse has printed what to print
        return exc.code if isinstance(exc.code, int) else EXIT_USER_ERROR
    except GGFlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except MemoryError as exc:
        hint = ": try a smaller -c/--ctx-size or model" if hasattr(args, "ctx_size") else ""
        print(f"error: out of memory{f' ({exc})' if str(exc) else ''}{hint}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `ggflow plugins | head`: the reader left, nothing is wrong
        # Point stdout at devnull so the interpreter's final flush doesn't raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        _end_output_line()
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _announcing_compiles(args: argparse.Namespace) -> ContextManager[object]:
    """Commands that run kernels set compiles_kernels (add_model_options does): they say when numba compiles."""
    if not getattr(args, "compiles_kernels", False):
        return contextlib.nullcontext()
    from ggflow.cli.compile_notice import CompileNotice

    return CompileNotice(sys.stderr)


def _interrupted(exc: BaseException | None) -> bool:
    """Ctrl-C, also where a library (numba's dispatcher, a C extension) turned it into another error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _end_output_line() -> None:
    """Flush what was generated; on a terminal end its line, so the message starts a line of its own."""
    try:
        if sys.stdout.isatty():
            print(file=sys.stdout)
        sys.stdout.flush()
    except Exception:  # a broken pipe on the way out is not worth a traceback
        pass
