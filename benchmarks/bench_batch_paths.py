"""The CPU matmul's batched kernels side by side: tile (int16), pairs (vpdpwssd) and quads (vpmaddubsw / vpdpbusd).

    python benchmarks/bench_batch_paths.py [--types Q4_1 Q4_K ...] [--tokens 1 3 4 8 64] [--shape 1536 576]

Every kernel a type has runs the same product on one thread in one process (medians of --repeats calls),
and its output is compared with the one-token matvec's, row by row: "=" is bit-identical, "DIFF" a bug.
Which kernel ``mul_mat`` picks for n tokens is ``qmm.template.batch_path``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import ggflow
from ggflow.backends_builtin.cpu.products.qmm import template as tmpl
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm
from ggflow.backends_builtin.cpu.products.qmm.amx import amx_available
from ggflow.core.types import type_traits

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 3, 4, 8, 64])
    ap.add_argument("--shape", type=int, nargs=2, default=[1536, 576], metavar=("ROWS", "K"),
                    help="K is rounded up to whole 256-element blocks for the K types")
    ap.add_argument("--repeats", type=int, default=100)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for w_type in args.types:
        traits = type_traits(w_type)
        rows, k = args.shape[0], -(-args.shape[1] // traits.block_size) * traits.block_size
        pw = qmm.pack_weight(ggflow.quantize(rng.standard_normal((rows, k)).astype(np.float32), w_type), w_type)
        pieces = qmm.cpu_pieces(traits)
        paths = ["tile", "pairs"] + (["quads"] if pieces.decode_quads else []) + (
            ["amx"] if tmpl.amx_takes(pieces) and amx_available() else [])
        for n in args.tokens:
            xq, dx, xe = qmm.quantize_activations(rng.standard_normal((n, k)).astype(np.float32), traits.vec_dot_type)
            matvec = np.empty((n, rows), np.float32)
            for i in range(n):
                pw.drivers.get(False)(pw.kind, pw.arrays, xq[i:i + 1], dx[i:i + 1], xe[i:i + 1], matvec[i:i + 1])
            line = f"{w_type} {rows}x{k} n={n:3d}:"
            for path in paths:
                kernel, out = pw.drivers.get(False, path), np.empty((n, rows), np.float32)
                kernel(pw.kind, pw.arrays, xq, dx, xe, out)
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    kernel(pw.kind, pw.arrays, xq, dx, xe, out)
                    times.append(time.perf_counter() - t0)
                same = "=" if np.array_equal(out, matvec) else "DIFF"
                line += f"  {path} {1e6 * statistics.median(times):8.1f} us ({same})"
            print(f"{line}  <- mul_mat takes {tmpl.batch_path(pw.kind, n)}", flush=True)


if __name__ == "__main__":
    main()
