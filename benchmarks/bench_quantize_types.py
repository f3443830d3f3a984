"""Encoder throughput per tensor type, with and without importance weights (ggflow.quantize, after a warm-up
call that compiles numba kernels and builds the i-quant grid tables).

    python benchmarks/bench_quantize_types.py [--rows 256] [--cols 4096] [--types Q4_K,IQ2_XS,...]

Prints millions of weights per second for each type: the time `ggflow quantize` spends per tensor is
about its size over this figure. Take figures on a quiet machine (docs/performance.md).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ggflow
from ggflow.core.quants import takes_importance

DEFAULT = ("Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS,IQ3_S,IQ3_XXS,IQ2_S,IQ2_XS,IQ2_XXS,"
           "TQ1_0,TQ2_0")
NEEDS_WEIGHTS = ("IQ2_XXS", "IQ2_XS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--types", default=DEFAULT)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    qw = rng.uniform(0.1, 2.0, args.cols).astype(np.float32)
    print(f"{'type':8s} {'plain Mw/s':>11s} {'imatrix Mw/s':>13s}")
    for name in args.types.split(","):
        cells = []
        for weights in (None, qw):
            if (weights is None and name in NEEDS_WEIGHTS) or (weights is not None and not takes_importance(name)):
                cells.append("-")
                continue
            ggflow.quantize(x[:1], name, weights)
            start = time.perf_counter()
            ggflow.quantize(x, name, weights)
            cells.append(f"{x.size / (time.perf_counter() - start) / 1e6:.2f}")
        print(f"{name:8s} {cells[0]:>11s} {cells[1]:>13s}")


if __name__ == "__main__":
    main()
