"""``ggflow warmup``: compile the CPU kernels a model needs now, so its first real run starts at once.

numba compiles a kernel for each type combination it is first called with and caches it on disk; a
two-token prompt and one decode step reach every kernel a model's tensor types use (prompt matmuls and
the single-row decode path both), so this is the same compile a first `ggflow run` pays, paid ahead.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ggflow.cli.common import add_model_options, load_llm
from ggflow.cli.compile_notice import compile_seconds


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("warmup", help="compile a model's kernels ahead of its first run",
                                   description="Load a model and evaluate a tiny prompt and one decode step, "
                                               "so numba compiles (and caches) the kernels its types need.")
    add_model_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    llm = load_llm(args)
    prompt = llm.tokenize("Hello there", add_special=True)[:2]
    while len(prompt) < 2:  # a prompt of several tokens takes the batched path, the decode step the other
        prompt.append(prompt[-1])
    llm.generate(prompt, 2, seed=0)  # the default sampler chain: its kernels compile too
    compiled = compile_seconds()
    print(f"warm: {llm.model_path.rsplit('/', 1)[-1]} ready in {time.perf_counter() - t0:.1f} s "
          f"({compiled:.1f} s compiling kernels{'' if compiled else ': all were cached'})", file=sys.stderr)
    return 0
