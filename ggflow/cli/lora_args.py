"""``--lora FILE`` and ``--lora-scaled FILE SCALE`` (llama-server's flags): adapters in command-line order,
which is their id order, into one list of (path, scale)."""
from __future__ import annotations

import argparse
import math
from typing import Any


class _AddAdapter(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None):
        if isinstance(values, str):
            path, scale = values, 1.0
        else:
            path, text = values
            try:
                scale = float(text)
            except ValueError:
                scale = math.nan
            if not math.isfinite(scale):
                parser.error(f"{option_string} {path} {text}: the scale must be a finite number")
        adapters = list(getattr(namespace, self.dest, None) or [])
        adapters.append((path, scale))
        setattr(namespace, self.dest, adapters)


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LoRA adapters (ids 0, 1, ... in command-line order; see /lora-adapters)")
    group.add_argument("--lora", dest="lora_adapters", metavar="FILE", action=_AddAdapter, default=[],
                       help="a LoRA adapter GGUF (convert_lora_to_gguf.py), at scale 1; repeatable")
    group.add_argument("--lora-scaled", dest="lora_adapters", metavar=("FILE", "SCALE"), nargs=2, action=_AddAdapter,
                       help="a LoRA adapter at this scale; repeatable")
