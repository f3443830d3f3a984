"""Speed of the CPU backend's matmul kernels (ggflow.backends_builtin.cpu.products.quant_matmul).

    python benchmarks/bench_matmul.py [--threads 1 2] [--types Q4_0 Q4_K ...] [--quick]
                                      [--no-cold | --cold-only] [--no-batch]

For every weight type: a matvec (1 token, decode) and a matmul (64 tokens, prompt) at 4096x4096 and
11008x4096, in GB/s of the weight's GGUF bytes and GFLOP/s (2*n*rows*k / time), beside numpy's F32
matvec on the same shape in the same run. Then a "cold" matvec over a set of matrices larger than
the L3 cache, cycled, so every weight byte comes from DRAM as in a real decode step.

Times are medians over repeats (min in brackets). The machine may be shared: compare ratios measured
in the same run, not absolute numbers across runs.
"""
from __future__ import annotations

import argparse
import os
import time

import numba
import numpy as np

import ggflow
from ggflow.backends_builtin.cpu.products import quant_matmul as qmm

SHAPES = [(4096, 4096), (11008, 4096)]
BATCH = 64
ALL_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def make_weight(w_type: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """GGUF bytes of a rows x k weight: quantize 256 random rows, tile them (speed ignores content)."""
    base = rng.standard_normal((min(rows, 256), k)).astype(np.float32)
    q = ggflow.quantize(base, w_type)
    reps = -(-rows // q.shape[0])
    return np.ascontiguousarray(np.tile(q, (reps, 1))[:rows])


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))


def l3_bytes() -> int:
    try:
        for idx in range(8):
            base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}/"
            if open(base + "level").read().strip() == "3":
                size = open(base + "size").read().strip()
                return int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]]
    except OSError:
        pass
    return 64 << 20


def row(label: str, n: int, rows: int, k: int, nbytes: int, med: float, best: float, ref: float | None) -> str:
    gbs = nbytes / med / 1e9
    gflops = 2 * n * rows * k / med / 1e9
    vs = f"  {ref / med:5.2f}x numpy" if ref else ""
    return (f"  {label:<8} n={n:<3} {rows:>5}x{k:<5} {med * 1e3:9.3f} ms [{best * 1e3:8.3f}] "
            f"{gbs:7.2f} GB/s {gflops:8.1f} GFLOP/s{vs}")


def bench_shapes(types: list[str], threads: list[int], repeats: int, rng: np.random.Generator,
                 batch: bool = True) -> None:
    for rows, k in SHAPES:
        w32 = rng.standard_normal((rows, k)).astype(np.float32)
        x1 = rng.standard_normal((1, k)).astype(np.float32)
        xb = rng.standard_normal((BATCH, k)).astype(np.float32)
        for nth in threads:
            numba.set_num_threads(nth)
            np_med, np_min = timed(lambda: w32 @ x1[0], repeats)
            print(f"\n{rows}x{k}, {nth} thread(s); numpy F32 matvec (its own BLAS threads): "
                  f"{np_med * 1e3:.3f} ms [{np_min * 1e3:.3f}] {w32.nbytes / np_med / 1e9:.2f} GB/s")
            for w_type in types:
                w = make_weight(w_type, rows, k, rng)
                pw = qmm.pack_weight(w, w_type)
                out1 = np.empty((1, rows), np.float32)
                outb = np.empty((BATCH, rows), np.float32)
                med, best = timed(lambda: qmm.mul_mat(pw, x1, out1), repeats)
                print(row(w_type, 1, rows, k, w.nbytes, med, best, np_med))
                if not batch:
                    continue
                med, best = timed(lambda: qmm.mul_mat(pw, xb, outb), max(3, repeats // 4))
                print(row(w_type, BATCH, rows, k, w.nbytes, med, best, None))


def bench_cold(types: list[str], threads: list[int], repeats: int, rng: np.random.Generator) -> None:
    rows, k = SHAPES[-1]
    target = 2 * l3_bytes()
    print(f"\ncold matvec: {rows}x{k} matrices cycled, a set of at least {target >> 20} MiB (2x L3)")
    x1 = rng.standard_normal((1, k)).astype(np.float32)
    out1 = np.empty((1, rows), np.float32)
    for w_type in types:
        w = make_weight(w_type, rows, k, rng)
        first = qmm.pack_weight(w, w_type)
        count = max(2, -(-target // first.nbytes))
        # copies of the packed arrays: distinct memory, same content
        packs = [first] + [qmm.PackedWeight(first.w_type, first.rows, first.k, tuple(a.copy() for a in first.arrays))
                           for _ in range(count - 1)]
        for nth in threads:
            numba.set_num_threads(nth)
            for pw in packs:
                qmm.mul_mat(pw, x1, out1)
            ts = []
            for _ in range(max(2, repeats // 4)):
                for pw in packs:
                    t0 = time.perf_counter()
                    qmm.mul_mat(pw, x1, out1)
                    ts.append(time.perf_counter() - t0)
            med, best = float(np.median(ts)), float(np.min(ts))
            print(f"  {w_type:<5} {nth} thread(s) {count:>3} matrices ({count * first.nbytes >> 20} MiB): "
                  f"{med * 1e3:8.3f} ms [{best * 1e3:8.3f}] per matrix, {w.nbytes / med / 1e9:6.2f} GB/s")
        del packs, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--types", nargs="+", default=ALL_TYPES)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, 4096x4096 only, no cold set")
    ap.add_argument("--no-cold", action="store_true", help="skip the larger-than-L3 set")
    ap.add_argument("--no-batch", action="store_true", help="matvecs only (skip the 64-token matmuls)")
    ap.add_argument("--cold-only", action="store_true", help="only the larger-than-L3 set")
    args = ap.parse_args()
    unknown = set(args.types) - qmm.SUPPORTED_TYPES
    if unknown:
        ap.error(f"no kernel for {sorted(unknown)}; choose from {sorted(qmm.SUPPORTED_TYPES)}")
    if args.quick:
        SHAPES[:] = SHAPES[:1]
    repeats = 5 if args.quick else 20
    rng = np.random.default_rng(0)
    print(f"ggflow {ggflow.__version__}, numba {numba.__version__}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs, L3 {l3_bytes() >> 20} MiB, tile {qmm.TILE} rows")
    t0 = time.perf_counter()
    for w_type in args.types:   # compile (or load from numba's cache) before timing anything
        pw = qmm.pack_weight(make_weight(w_type, 64, 256, rng), w_type)
        for n in (1, BATCH):
            qmm.mul_mat(pw, np.ones((n, 256), np.float32), np.empty((n, 64), np.float32))
    print(f"kernels ready in {time.perf_counter() - t0:.1f} s (compile or cache load)")
    if not args.cold_only:
        bench_shapes(args.types, args.threads, repeats, rng, batch=not args.no_batch)
    if not (args.quick or args.no_cold):
        bench_cold(args.types, args.threads, repeats, rng)


if __name__ == "__main__":
    main()
