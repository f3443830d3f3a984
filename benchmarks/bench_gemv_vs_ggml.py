"""One-token products (GEMV) of ggml and ggflow, alternated in blocks in one process: which engine's kernel
streams a weight from memory faster, at the same moments of the host.

bench_vs_llamacpp and bench_decode_paired compare whole decode steps; this compares the products alone, the
part of a step that streams the weights. One process holds both engines: ggml through a small C shim
(``ggml_gemv_shim.c``, compiled here against the llama.cpp build that GGML_DIR names; ggml's weights where
llama.cpp would put them, its repacked CPU_REPACK buffer where that supports the type) and ggflow's
``pack_weight`` kernels, the same quantized bytes in both (``ggflow.quantize``; the results are compared
before timing). ``--copies`` row-rolled copies of the weight are cycled so that every call reads from memory
(their total should pass the L3 cache). Blocks of ``--calls`` calls of one engine alternate, the order
rotating each block; a block's median over its calls after the first ``WARM_CALLS`` (the pool of the engine
that ran before has gone idle by then) counts. Ratios are taken block pair by block pair, so both sides saw
the same moment of the host (this VM's memory rate moves between two states: docs/performance.md, "Fifteenth
session").

    GGML_DIR=path/to/llama.cpp python benchmarks/bench_gemv_vs_ggml.py [--type Q4_0 Q4_K ...]
        [--rows 5632] [--k 2048] [-t 2] [--copies 24] [--blocks 40] [--calls 40]

GGML_DIR is a llama.cpp source tree built with CMake: headers under ggml/include, the libggml*.so files under
build/bin (``--ggml-include`` / ``--ggml-lib`` say otherwise). Needs a C compiler (``cc``).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

# Each engine's idle threads spin a while for more work; ggflow's (libgomp's, GOMP_SPINCOUNT, set at ggflow's
# import where the user set none) would spin milliseconds into ggml's block. Short spins: each block's first
# calls then pay for a wake-up, which WARM_CALLS leaves out.
os.environ.setdefault("GOMP_SPINCOUNT", "2000")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

SHIM = Path(__file__).with_name("ggml_gemv_shim.c")
WARM_CALLS = 10
GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12,
              "Q5_K": 13, "Q6_K": 14}     # ggml's enum ggml_type values
BLOCK_SIZE = {name: 256 if name.endswith("_K") else 32 for name in GGML_TYPES}
GGML = "ggml"
GGFLOW = "ggflow"


def build_shim(include: Path, lib: Path, out_dir: Path) -> ctypes.CDLL:
    """Compile the shim against ggml's headers and libraries and load it."""
    target = out_dir / "libggml_gemv_shim.so"
    cmd = ["cc", "-O2", "-shared", "-fPIC", str(SHIM), f"-I{include}", f"-L{lib}", "-lggml", "-lggml-base",
           "-lggml-cpu", f"-Wl,-rpath,{lib}", "-o", str(target)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError("no C compiler: the ggml shim needs `cc`") from None
    if done.returncode != 0:
        raise RuntimeError(f"compiling the ggml shim against {include} and {lib} failed: "
                           f"{' '.join(done.stderr.split())[-600:]}")      # one line: the parent shows a worker's last
    shim = ctypes.CDLL(str(target))
    shim.shim_setup.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_int]
    shim.shim_weight_buffer.restype = ctypes.c_char_p
    shim.shim_set_x.argtypes = [ctypes.c_void_p, ctypes.c_int]
    shim.shim_run.argtypes = [ctypes.c_int]
    shim.shim_get_out.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    return shim


def blocks(runners: dict[str, Callable[[int], None]], n_blocks: int, calls: int, warm: int = WARM_CALLS,
           after: dict[str, Callable[[], None]] | None = None) -> dict[str, list[float]]:
    """Each runner ``calls`` times in a row per block, the order rotated by one each block (a runner gets the
    running call index, to pick its copy); per runner and block, the median seconds of its calls after the
    first ``warm``. ``after[name]()`` runs once each of that runner's blocks has ended."""
    names = list(runners)
    medians: dict[str, list[float]] = {name: [] for name in names}
    call = 0
    for b in range(n_blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            seconds = []
            for _ in range(calls):
                start = time.perf_counter()
                runners[name](call)
                seconds.append(time.perf_counter() - start)
                call += 1
            medians[name].append(statistics.median(seconds[warm:]))
            if after and name in after:
                after[name]()
    return medians


def summary(medians: dict[str, list[float]], nbytes: int) -> dict[str, float]:
    """GB/s of each engine (median over blocks) and ggflow's speed over ggml's taken block pair by block pair:
    the median and the 10th and 90th percentiles (the host's states move both engines, not always alike)."""
    ggml, ours = np.asarray(medians[GGML]), np.asarray(medians[GGFLOW])
    ratios = ggml / ours                       # seconds: ggml's over ggflow's is ggflow's speed over ggml's
    low, mid, high = np.percentile(ratios, [10, 50, 90])
    return {"ggml_gbs": nbytes / float(np.median(ggml)) / 1e9, "ggflow_gbs": nbytes / float(np.median(ours)) / 1e9,
            "ratio": float(mid), "ratio_p10": float(low), "ratio_p90": float(high)}


def row_copies(q: np.ndarray, copies: int) -> list[np.ndarray]:
    """``copies`` distinct weights from one: its rows rolled by 0, 1, ... (the same work, other bytes)."""
    return [np.ascontiguousarray(np.roll(q, c, axis=0)) for c in range(copies)]


def compare(shim: ctypes.CDLL, w_type: str, rows: int, k: int, threads: int, copies: int, n_blocks: int,
            calls: int, seed: int = 0) -> dict[str, object]:
    import numba

    import ggflow
    from ggflow.backends_builtin.cpu.products import quant_matmul as qmm

    numba.set_num_threads(threads)      # ggflow's parallel kernels on as many threads as ggml's pool
    rng = np.random.default_rng(seed)
    q = ggflow.quantize(rng.standard_normal((rows, k)).astype(np.float32), w_type)
    weights = row_copies(q, copies)
    data = np.concatenate(weights)
    code = shim.shim_setup(GGML_TYPES[w_type], rows, k, copies, data.ctypes.data, q.shape[1], threads)
    if code != 0:
        raise RuntimeError(f"ggml set-up failed (step {code}) for {w_type} {rows} x {k}")
    del data
    packed = [qmm.pack_weight(w, w_type) for w in weights]
    del weights
    x = rng.standard_normal((1, k)).astype(np.float32)
    shim.shim_set_x(x.ctypes.data, k)
    acts = qmm.quantize_activations(x, packed[0].vec_dot_type)
    out = np.empty((1, rows), np.float32)
    kernel = packed[0].kernel(threads > 1, 1)

    def ggflow_call(i: int) -> None:
        pw = packed[i % copies]
        kernel(pw.kind, pw.arrays, *acts, out)

    def ggml_call(i: int) -> None:
        if shim.shim_run(i % copies) != 0:
            raise RuntimeError("ggml's graph compute failed")

    ggflow_call(0)
    ggml_call(0)
    theirs = np.empty(rows, np.float32)
    shim.shim_get_out(0, theirs.ctypes.data, rows)
    # the same integer block sums, float accumulation in another order (each engine's own, f32)
    scale = float(np.abs(theirs).max()) or 1.0
    diff = float(np.abs(theirs - out[0]).max()) / scale
    if diff > 1e-4:
        raise RuntimeError(f"ggml and ggflow disagree on {w_type} {rows} x {k}: max difference {diff:.2e} of the "
                           f"largest output")
    medians = blocks({GGML: ggml_call, GGFLOW: ggflow_call}, n_blocks, calls, after={GGML: shim.shim_pause})
    result = summary(medians, packed[0].nbytes)
    result["ggml_buffer"] = shim.shim_weight_buffer().decode()
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--type", nargs="+", default=["Q4_0", "Q4_K", "Q6_K", "Q8_0"], dest="types")
    ap.add_argument("--rows", type=int, default=5632)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--copies", type=int, default=24, help="weights cycled (together past the L3 cache)")
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--calls", type=int, default=40, help=f"calls a block (the first {WARM_CALLS} not counted)")
    ap.add_argument("--ggml-dir", type=Path, default=os.environ.get("GGML_DIR"),
                    help="a built llama.cpp tree (default: $GGML_DIR)")
    ap.add_argument("--ggml-include", type=Path, help="ggml's headers (default: GGML_DIR/ggml/include)")
    ap.add_argument("--ggml-lib", type=Path, help="libggml*.so (default: GGML_DIR/build/bin)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [t for t in args.types if t.upper() not in GGML_TYPES]
    if unknown:
        ap.error(f"unknown type(s) {unknown}; known: {', '.join(GGML_TYPES)}")
    args.types = [t.upper() for t in args.types]
    if args.rows < 1 or args.blocks < 2:
        ap.error("--rows must be at least 1, --blocks at least 2")
    if not 0 < args.threads <= (os.cpu_count() or 1):
        ap.error(f"--threads must be 1..{os.cpu_count()} (this machine's CPUs)")
    block = max(BLOCK_SIZE[t] for t in args.types)
    if args.k < 1 or args.k % block:
        ap.error(f"--k must be a positive multiple of {block} (the types' block size)")
    if not 0 < args.copies <= 256:
        ap.error("--copies must be 1..256 (the shim's limit)")
    if args.calls <= WARM_CALLS:
        ap.error(f"--calls must be more than the {WARM_CALLS} warm-up calls a block leaves out")
    if args.ggml_include is None or args.ggml_lib is None:
        if args.ggml_dir is None:
            ap.error("no ggml: set GGML_DIR (a built llama.cpp tree) or pass --ggml-dir, "
                     "or --ggml-include and --ggml-lib")
        args.ggml_include = args.ggml_include or args.ggml_dir / "ggml" / "include"
        args.ggml_lib = args.ggml_lib or args.ggml_dir / "build" / "bin"
    if not (args.ggml_include / "ggml.h").is_file():
        ap.error(f"no ggml.h under {args.ggml_include}")
    if not any(args.ggml_lib.glob("libggml-cpu.*")):
        ap.error(f"no libggml-cpu under {args.ggml_lib} (build llama.cpp with CMake first)")
    return args


def worker(args: argparse.Namespace) -> None:
    """One type in this process (the shim's ggml state is one set-up a process): its result as a JSON line."""
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(args.ggml_include, args.ggml_lib, Path(tmp))
        result = compare(shim, args.types[0], args.rows, args.k, args.threads, args.copies, args.blocks, args.calls)
    print(json.dumps(result), flush=True)


def run_type(args: argparse.Namespace, w_type: str) -> dict[str, object]:
    cmd = [sys.executable, __file__, "--worker", "--type", w_type, "--rows", str(args.rows), "--k", str(args.k),
           "-t", str(args.threads), "--copies", str(args.copies), "--blocks", str(args.blocks), "--calls",
           str(args.calls), "--ggml-include", str(args.ggml_include), "--ggml-lib", str(args.ggml_lib)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"{w_type}: {said.removeprefix('error: ')}")
    return json.loads(lines[-1])


def table_row(args: argparse.Namespace, w_type: str, r: dict[str, object]) -> str:
    return (f"| {w_type} | {args.rows} x {args.k} | {args.threads} | {r['ggml_buffer']} | {r['ggml_gbs']:.1f} "
            f"| {r['ggflow_gbs']:.1f} | {r['ratio']:.2f} | {r['ratio_p10']:.2f}-{r['ratio_p90']:.2f} |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.worker:
            worker(args)
            return
        lines = ["| type | weight | threads | ggml's buffer | ggml GB/s | ggflow GB/s | ggflow / ggml "
                 "| 10-90% of block ratios |", "|---|---|---|---|---|---|---|---|"]
        for w_type in args.types:
            lines.append(table_row(args, w_type, run_type(args, w_type)))
            print(lines[-1], flush=True)
    except RuntimeError as exc:    # no compiler, a failed build or set-up, engines that disagree: said, not traced
        sys.exit(f"error: {exc}")
    print(f"\n{args.copies} copies cycled, {args.blocks} blocks of {args.calls} calls, medians of blocks")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
