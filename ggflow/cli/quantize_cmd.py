"""``ggflow quantize IN.gguf OUT.gguf TYPE``: rewrite a model in one of llama-quantize's mixes, or in one
tensor type (a plugin's too), with llama-quantize's per-tensor overrides."""
from __future__ import annotations

import argparse
from typing import Any

from ggflow.cli.args import not_a_directory
from ggflow.quantize_model.mixes import ALIASES, MIXES


def add_parser(subparsers: Any) -> None:
    mixes = ", ".join(MIXES)
    aliases = ", ".join(f"{a} = {m}" for a, m in ALIASES.items())
    parser = subparsers.add_parser(
        "quantize", help="rewrite a GGUF model in another type (llama.cpp's quantization mixes)",
        description=f"Rewrite a GGUF model with each tensor in the type llama-quantize gives it for TYPE "
                    f"(with --imatrix FILE, its importance weights). Mixes: {mixes} (aliases {aliases}). TYPE may also be a tensor "
                    "type with a quantizer, a plugin's too (`ggflow plugins` lists them): every quantizable "
                    "tensor then gets that type. Already-quantized tensors are decoded and requantized. "
                    "OUT is replaced only once it is complete.")
    parser.add_argument("input", metavar="IN.gguf", help="model to read (F32, F16, BF16 or quantized)")
    parser.add_argument("output", metavar="OUT.gguf", help="file to write")
    parser.add_argument("type", metavar="TYPE", help=f"one of {mixes}, or a tensor type")
    parser.add_argument("--pure", action="store_true",
                        help="every quantizable tensor in TYPE's base type: no output/attn_v/ffn_down promotions")
    parser.add_argument("--tensor-type", metavar="PATTERN=TYPE", action="append", dest="tensor_types",
                        help="tensors whose name the regular expression PATTERN matches get tensor type TYPE "
                             "(repeatable; the first matching PATTERN wins; e.g. 'attn_v=Q8_0')")
    parser.add_argument("--output-tensor-type", metavar="TYPE", help="the tensor type of output.weight")
    parser.add_argument("--token-embedding-type", metavar="TYPE", help="the tensor type of token_embd.weight")
    parser.add_argument("--imatrix", metavar="FILE",
                        help="importance matrix (ggflow imatrix / llama-imatrix, GGUF or legacy .dat) for the "
                             "quantizers that take one; the 1- and 2-bit i-quant types need it")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    not_a_directory(args.input, "IN.gguf")  # a missing file: quantize_model says so itself
    from ggflow.quantize_model import quantize_model

    report = quantize_model(args.input, args.output, args.type, pure=args.pure, progress=not args.quiet,
                            tensor_types=args.tensor_types, output_tensor_type=args.output_tensor_type,
                            token_embedding_type=args.token_embedding_type, imatrix=args.imatrix)
    print(report.summary())
    return 0
