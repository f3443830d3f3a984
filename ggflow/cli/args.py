"""Checks of command-line values: each bad value becomes one line naming the option, the value and what
is accepted (argparse's own usage errors included, through ``Parser.error``), never a traceback."""
from __future__ import annotations

import argparse
import os
from typing import Callable

from ggflow.errors import GGFlowError


class UsageError(GGFlowError, ValueError):
    """A command-line value the command cannot use."""


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors raised as UsageError (one line, exit 2) instead of usage + exit."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def int_at_least(low: int, meaning: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= low; `meaning` says what the lowest special value means."""
    accepted = f"an integer >= {low}" + (f" ({meaning})" if meaning else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; accepted: {accepted}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is out of range; accepted: {accepted}")
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid <name> value" messages
    return parse


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    value = int_at_least(0, "0: any free port")(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range; accepted: a port 0..65535")
    return value


def not_a_directory(path: str, name: str) -> str:
    if os.path.isdir(path):
        raise UsageError(f"{name} {path!r} is a directory; accepted: a GGUF model file")
    return path


def existing_file(path: str, name: str) -> str:
    """An existing regular file: a directory or a missing path is named as what it is."""
    not_a_directory(path, name)
    if not os.path.exists(path):
        raise UsageError(f"{name} {path!r}: no such file; accepted: a GGUF model file")
    if not os.path.isfile(path):
        raise UsageError(f"{name} {path!r} is not a regular file; accepted: a GGUF model file")
    return path


def model_file(path: str) -> str:
    return existing_file(path, "-m/--model")


