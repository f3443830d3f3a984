"""``ggflow convert HF_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0]``: a Hugging Face model to GGUF."""
from __future__ import annotations

import argparse
from typing import Any

from ggflow.convert.writer import OUTTYPES


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert a Hugging Face model directory to GGUF (as llama.cpp's convert_hf_to_gguf.py)",
        description="Write the model in HF_DIR (config.json, *.safetensors or pytorch_model*.bin, tokenizer.json) "
                    "as a GGUF file with llama.cpp's metadata keys and tensor names. Tensors are read one at a "
                    "time; OUT is replaced only once it is complete.")
    parser.add_argument("hf_dir", metavar="HF_DIR", help="the Hugging Face model's directory")
    parser.add_argument("output", metavar="OUT.gguf", help="file to write")
    parser.add_argument("--outtype", choices=OUTTYPES, default="f16",
                        help="type of the 2-D weights (norms, biases stay F32; default f16)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ggflow.convert import convert

    arch = convert(args.hf_dir, args.output, args.outtype, progress=not args.quiet)
    print(f"wrote {args.output} ({arch}, {args.outtype})")
    return 0
