"""``ggflow warmup``: compile the CPU kernels a model needs now, so its first real run starts at once.

numba compiles a kernel for each type combination it is first called with and caches it on disk. Kernels
come in a parallel driver for large tensors and a serial one for small ones (threads.py), so warmup runs a
prompt long enough for the parallel drivers (PROMPT_TOKENS) and decode steps, one token each, for the
serial ones, and a short prompt (a batch of a few rows: some kernels see other array layouts there):
every kernel the model's tensor types reach, the compile a first `ggflow run` would pay.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ggflow.cli.common import add_model_options, load_llm
from ggflow.cli.compile_notice import compile_seconds

# 128 rows of a 576-wide model (SmolLM2) pass every parallel threshold (norm, rope: 65536 elements;
# matmuls and attention: 2**20 multiply-adds); a one-token decode step stays under them all.
PROMPT_TOKENS = 128
DECODE_STEPS = 2
SHORT_PROMPT_TOKENS = 5


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("warmup", help="compile a model's kernels ahead of its first run",
                                   description="Load a model, evaluate a prompt and a few one-token decode steps, so "
                                               "numba compiles (and caches) every kernel its types need.")
    add_model_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    llm = load_llm(args)
    bos = llm.tokenize("", add_special=True)
    words = llm.tokenize(" the quick brown fox jumps over the lazy dog", add_special=False)
    n_prompt = max(1, min(PROMPT_TOKENS, llm.n_ctx - DECODE_STEPS))
    prompt = (bos + words * n_prompt)[:n_prompt]
    llm.generate(prompt, 1, seed=0)  # the default sampler chain's kernels compile too
    for step in range(1, min(DECODE_STEPS, llm.n_ctx - n_prompt) + 1):
        llm.generate(prompt + words[:step], 1, seed=0)  # the cached prefix is reused: one token evaluated
    short = (bos + words[::-1] * SHORT_PROMPT_TOKENS)[:min(SHORT_PROMPT_TOKENS, llm.n_ctx)]
    llm.generate(short, 1, seed=0)  # differs from the cached prompt after BOS: evaluated as one batch
    compiled = compile_seconds()
    print(f"warm: {llm.model_path.rsplit('/', 1)[-1]} ready in {time.perf_counter() - t0:.1f} s "
          f"({compiled:.1f} s compiling kernels{'' if compiled else ': all were cached'})", file=sys.stderr)
    return 0
