"""``ggflow imatrix -m MODEL -f TEXT [-o imatrix.gguf]``: llama-imatrix's importance matrix of a model over a text."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ggflow.cli.args import UsageError, int_at_least


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "imatrix", help="compute an importance matrix (llama-imatrix) for quantize --imatrix",
        description="Run MODEL over TEXT in chunks of CTX tokens and write, per weight matrix, the sum of its "
                    "squared input activations per column and the number of rows summed, as llama-imatrix "
                    "computes them, in llama.cpp's imatrix GGUF format (or its legacy .dat).")
    parser.add_argument("-m", "--model", required=True, help="GGUF model file")
    parser.add_argument("-f", "--file", required=True, help="text file to run the model over")
    parser.add_argument("-o", "--output", default="imatrix.gguf", help="output file (default imatrix.gguf)")
    parser.add_argument("-c", "--ctx-size", type=int_at_least(1), default=512, help="tokens per chunk (default 512)")
    parser.add_argument("--chunk", "--from-chunk", type=int_at_least(0), default=0, dest="from_chunk",
                        help="start from chunk N (skip the first N chunks)")
    parser.add_argument("--chunks", type=int, default=-1, help="most chunks to process (default -1: all)")
    parser.add_argument("--process-output", action="store_true", help="collect output.weight too")
    parser.add_argument("--output-format", choices=("gguf", "dat"), default=None,
                        help="gguf (default) or llama.cpp's legacy dat")
    parser.add_argument("-b", "--ubatch-size", type=int_at_least(1), default=512, help="tokens per graph evaluation")
    parser.add_argument("-t", "--threads", type=int_at_least(1), default=None, help="CPU threads")
    parser.add_argument("--backend", default="auto", help="backend name(s), comma separated (default: auto)")
    parser.add_argument("--cache-type-k", type=str.upper, choices=("F16", "F32"), default="F16", help="KV cache type for K")
    parser.add_argument("--cache-type-v", type=str.upper, choices=("F16", "F32"), default="F16", help="KV cache type for V")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=run, compiles_kernels=True)


def run(args: argparse.Namespace) -> int:
    from ggflow.imatrix import compute_imatrix, write_dat, write_gguf

    text_path = Path(args.file)
    if not text_path.is_file():
        raise UsageError(f"-f {args.file}: no such text file")
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"-o {args.output}: the directory {out.parent} does not exist")
    text = text_path.read_text(encoding="utf-8", errors="replace")
    m = compute_imatrix(args.model, text, n_ctx=args.ctx_size, from_chunk=args.from_chunk, n_chunks=args.chunks,
                        process_output=args.process_output, dataset=args.file, n_ubatch=args.ubatch_size,
                        backends=args.backend, n_threads=args.threads,
                        type_k=args.cache_type_k, type_v=args.cache_type_v, progress=not args.quiet)
    (write_dat if args.output_format == "dat" else write_gguf)(out, m)
    print(f"{out}: {len(m.entries)} entries over {m.chunk_count} chunks of {m.chunk_size} tokens")
    return 0
