"""Decode speed of llama.cpp and ggflow (or of ggflow variants), paired round by round in one sitting.

A one-token decode step streams every weight from memory, so it runs at the memory's rate, and on a shared
host that rate moves: this VM's moved by a third within seconds (other tenants), and bench_vs_llamacpp's
two-thread decode ratios moved 0.78-1.17 between runs minutes apart. Here each ggflow variant is one process
that loads the model once and decodes on request, and every round runs one llama-bench tg (a fresh process,
``-p 0 -n N -r 1``) and one decode run of each variant back to back, in an order that rotates from round to
round. Each round's figures are divided by its reference's (llama.cpp, else the first variant) and the
medians of those per-round ratios printed: both sides of a ratio saw the same moment of the host.

    LLAMA_BENCH=path/to/llama-bench python benchmarks/bench_decode_paired.py MODEL.gguf [-t 2] [--rounds 12]
        [-n 32] [--variant NAME=VAR=VALUE[,VAR=VALUE...] ...] [--no-llama]

A variant runs ggflow with some environment variables set: ``--variant old=PYTHONPATH=/path/to/older/checkout``
compares two commits (give a kernel change its own NUMBA_CACHE_DIR too), ``--variant spin=GOMP_SPINCOUNT=0``
a setting. With no --variant, one named "ggflow" in the caller's environment. A ggflow run: the cache cleared,
N decode steps of one token from position 0, timed together (ggflow bench's tg); llama-bench's tg is the same
test. ``--worker`` is the variant processes' own entry point.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

# appended, not put first: a variant's PYTHONPATH (another checkout) must win over this one
sys.path.append(str(Path(__file__).resolve().parents[1]))

LLAMA = "llama.cpp"
# llama-bench (libgomp too) must not inherit the wait policy ggflow's import sets (see bench_vs_llamacpp)
CALLER_ENV = dict(os.environ)
READY = "ready"


def worker(model: str, threads: int, n_gen: int) -> None:
    """Load the model, warm up, print READY; then for every line on stdin decode n_gen tokens, print tokens/s."""
    from ggflow.core.batch import Batch
    from ggflow.core.context import Context
    from ggflow.core.model import Model

    ctx = Context(Model.load(model), n_ctx=max(256, n_gen + 1), n_threads=threads)

    def tg() -> float:
        ctx.clear()
        start = time.perf_counter()
        for pos in range(n_gen):
            ctx.decode(Batch.from_tokens([7], pos0=pos))
        return n_gen / (time.perf_counter() - start)

    tg()        # compiles or loads the kernels, packs the weights, builds the graph
    tg()
    print(f"{READY} {Path(sys.modules['ggflow'].__file__).parent.parent}", flush=True)
    for _ in sys.stdin:
        print(f"{tg():.3f}", flush=True)


class Variant:
    """A ggflow worker process under its environment."""

    def __init__(self, name: str, env: dict[str, str], args: argparse.Namespace):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", args.model, "-t", str(args.threads), "-n", str(args.n_gen)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**CALLER_ENV, **env})
        line = self.proc.stdout.readline().split(maxsplit=1)
        if line[:1] != [READY]:
            self.close()
            raise RuntimeError(f"variant {name!r}: the worker did not start (exit {self.proc.returncode}); "
                               f"its stderr is above")
        self.source = line[1].strip() if len(line) > 1 else "?"     # the checkout whose ggflow it runs

    def run(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"variant {self.name!r}: the worker exited (code {self.proc.wait()})")
        return float(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_llama(binary: str, model: str, threads: int, n_gen: int) -> float:
    cmd = [binary, "-m", model, "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", "1", "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=CALLER_ENV)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(done.stdout)[0]["avg_ts"])


def rounds(runners: dict[str, Callable[[], float]], n_rounds: int, report=print) -> dict[str, list[float]]:
    """Every runner once a round, the order rotated by one each round; tokens/s per runner, round by round."""
    names = list(runners)
    speeds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(n_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            speeds[name].append(runners[name]())
        report(f"round {r + 1}/{n_rounds}: " + "  ".join(f"{name} {speeds[name][-1]:.1f}" for name in names))
    return speeds


def summary(speeds: dict[str, list[float]]) -> list[str]:
    """Per runner: the median tokens/s and the median of its per-round ratios to the first runner's."""
    reference = next(iter(speeds))
    lines = [f"| | tg tokens/s (median) | ratio to {reference} (median of rounds) | ratio range |", "|---|---|---|---|"]
    for name, values in speeds.items():
        ratios = [v / ref for v, ref in zip(values, speeds[reference])]
        lines.append(f"| {name} | {statistics.median(values):.1f} | {statistics.median(ratios):.2f} "
                     f"| {min(ratios):.2f}-{max(ratios):.2f} |")
    return lines


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    env = {}
    for item in filter(None, assignments.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not var:
            raise argparse.ArgumentTypeError(f"variant {text!r}: want NAME=VAR=VALUE[,VAR=VALUE...]")
        env[var] = value
    if not name:
        raise argparse.ArgumentTypeError(f"variant {text!r} has no name")
    return name, env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("model", help="a GGUF file")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="tokens per decode run")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--variant", type=parse_variant, action="append", default=[],
                    help="NAME=VAR=VALUE[,VAR=VALUE...]: a ggflow process with these variables set")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"),
                    help="path of llama.cpp's llama-bench (default: $LLAMA_BENCH)")
    ap.add_argument("--no-llama", dest="llama", action="store_false", help="ggflow variants only")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not Path(args.model).is_file():
        ap.error(f"model {args.model!r} is not a file")
    if args.threads < 1 or args.n_gen < 1 or args.rounds < 1:
        ap.error("--threads, -n and --rounds must be at least 1")
    if args.worker:
        return args
    if args.llama and not (args.llama_bench and os.access(args.llama_bench, os.X_OK)):
        ap.error("no executable llama-bench: pass --llama-bench PATH, set LLAMA_BENCH, or give --no-llama")
    if not args.variant:
        args.variant = [("ggflow", {})]
    names = [name for name, _ in args.variant] + ([LLAMA] if args.llama else [])
    if len(set(names)) != len(names):
        ap.error(f"variant names must differ from each other and from {LLAMA!r}: {names}")
    if len(names) < 2:
        ap.error("nothing to pair: give llama-bench or two variants")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args.model, args.threads, args.n_gen)
        return
    variants: list[Variant] = []
    try:
        for name, env in args.variant:
            variants.append(Variant(name, env, args))
            print(f"{name}: loaded, ggflow from {variants[-1].source}", flush=True)
        runners = {LLAMA: lambda: run_llama(args.llama_bench, args.model, args.threads, args.n_gen)} if args.llama else {}
        runners.update({v.name: v.run for v in variants})
        speeds = rounds(runners, args.rounds, report=lambda line: print(line, flush=True))
    except RuntimeError as exc:     # a worker that did not start or died, a failing llama-bench: said, not traced
        sys.exit(f"error: {exc}")
    finally:
        for v in variants:
            v.close()
    print(f"\n{Path(args.model).name}, -t {args.threads}, tg{args.n_gen}, {args.rounds} rounds")
    print("\n".join(summary(speeds)))


if __name__ == "__main__":
    main()
