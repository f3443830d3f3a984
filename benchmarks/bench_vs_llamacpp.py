"""ggflow against llama.cpp on the same GGUF files: llama-bench's pp/tg speeds and peak RSS, side by side.

Both engines run interleaved (per round, per model, per thread count: one llama-bench, one ggflow bench, in
alternating order), so drifting machine load hits both alike. A cell is the median of every repetition of
every round; the ratio is ggflow / llama.cpp. Peak RSS: llama.cpp's is the child's maximum resident set as
the kernel reports it at exit (wait4's rusage, the figure /usr/bin/time -v prints), ggflow's its own report.
    LLAMA_BENCH=path/to/llama-bench python benchmarks/bench_vs_llamacpp.py [MODEL.gguf ...]
        [--threads 1 2] [--rounds 3] [-r 3] [-p 64] [-n 32] [-d 0]
With no model, the default one (ggflow.api.default_model_path()). ``--shape llama3-8b --types Q4_0 Q4_K_M``
generates random-weight models of a real model's shape (make_shape_model.py, seeded) into ``--model-dir``
(kept for later runs, never committed), quantized by llama-quantize (found next to llama-bench), and adds them. ``PYTHONPATH=/other/checkout`` runs that
checkout's ggflow instead of this one's, from any directory.
Before the rounds, ggflow runs each cell once untimed (``--no-warm-up`` skips it): numba compiles a kernel the
first time a process needs it and caches it on disk, and a round that compiled would count that time's memory
(LLVM's, ~50 MiB on the default model) in its peak RSS, as the first run after any change to a kernel does.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHECKOUT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, CHECKOUT)
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Both engines get the caller's environment: importing ggflow here (for the default model's path) sets
# OMP_WAIT_POLICY in os.environ, which llama-bench (libgomp too) would otherwise inherit. This checkout goes
# after the caller's PYTHONPATH, and ggflow runs with -P (no working directory on sys.path): so
# ``PYTHONPATH=/other/checkout`` measures that checkout from anywhere, and this one runs uninstalled.
CALLER_ENV = dict(os.environ)
CALLER_ENV["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), CHECKOUT) if p)


@dataclass
class Samples:
    """Every measured repetition of one engine on one (model, threads) cell, over all rounds."""

    pp: list[float] = field(default_factory=list)
    tg: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run_child(cmd: list[str]) -> tuple[int, str, str, float]:
    """Run cmd; return its exit code, stdout, stderr and peak RSS in MiB (the kernel's ru_maxrss of it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=CALLER_ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss / 1024


def failure(what: str, rc: int, err: str) -> str:
    """What a child that exited with rc reported: its last line of stderr."""
    return f"{what} exit {rc}: {err.strip().splitlines()[-1:] or ''}"


def bench_llamacpp(binary: str, model: str, args: argparse.Namespace, threads: int, into: Samples) -> None:
    cmd = [binary, "-m", model, "-p", str(args.n_prompt), "-n", str(args.n_gen), "-t", str(threads),
           "-r", str(args.repetitions), "-d", str(args.n_depth), "-o", "json"]
    rc, out, err, rss = run_child(cmd)
    if rc != 0:
        into.errors.append(failure("llama-bench", rc, err))
        return
    for test in json.loads(out):
        speeds = test["samples_ts"]
        (into.pp if test["n_prompt"] > 0 else into.tg).extend(speeds)
    into.rss_mib.append(rss)


def ggflow_command(model: str, args: argparse.Namespace, threads: int, repetitions: int) -> list[str]:
    return [sys.executable, "-P", "-m", "ggflow.cli", "bench", "-m", model, "-p", str(args.n_prompt),
            "-n", str(args.n_gen), "-t", str(threads), "-r", str(repetitions), "-d", str(args.n_depth), "--json"]


def bench_ggflow(model: str, args: argparse.Namespace, threads: int, into: Samples) -> None:
    rc, out, err, _ = run_child(ggflow_command(model, args, threads, args.repetitions))
    if rc != 0:
        into.errors.append(failure("ggflow bench", rc, err))
        return
    report = json.loads(out)
    for result in report["results"]:
        (into.pp if result["test"].startswith("pp") else into.tg).extend(result["runs"])
    into.rss_mib.append(report["peak_rss_mb"])


def warm_up_ggflow(model: str, args: argparse.Namespace, threads: int) -> str | None:
    """One untimed ggflow bench of the cell (one repetition), so that the rounds load every kernel from numba's
    cache; returns what went wrong, if anything (the rounds then report it too)."""
    rc, _, err, _ = run_child(ggflow_command(model, args, threads, repetitions=1))
    return None if rc == 0 else failure("warm-up", rc, err)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def ratio(ours: float | None, theirs: float | None) -> str:
    return "n/a" if ours is None or not theirs else f"{ours / theirs:.2f}"


def table(cells: dict[tuple[str, int], tuple[Samples, Samples]], args: argparse.Namespace) -> str:
    at = f" @ d{args.n_depth}" if args.n_depth else ""
    pp, tg = f"pp{args.n_prompt}{at}", f"tg{args.n_gen}{at}"
    lines = [f"| model | threads | llama.cpp {pp} | ggflow {pp} | ratio | llama.cpp {tg} | ggflow {tg} | ratio "
             f"| peak RSS MiB llama.cpp / ggflow |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (model, threads), (theirs, ours) in cells.items():
        l_pp, g_pp, l_tg, g_tg = median(theirs.pp), median(ours.pp), median(theirs.tg), median(ours.tg)
        rss = f"{fmt(median(theirs.rss_mib), 0)} / {fmt(median(ours.rss_mib), 0)}"
        lines.append(f"| {Path(model).name} | {threads} | {fmt(l_pp)} | {fmt(g_pp)} | {ratio(g_pp, l_pp)} "
                     f"| {fmt(l_tg)} | {fmt(g_tg)} | {ratio(g_tg, l_tg)} | {rss} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("models", nargs="*", help="GGUF files (default: ggflow's default model)")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"),
                    help="path of llama.cpp's llama-bench (default: $LLAMA_BENCH)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all cells")
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per engine per round")
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-d", "--n-depth", type=int, default=0, help="tokens in the KV cache before each test")
    ap.add_argument("--shape", help="also bench a random-weight model of this shape (make_shape_model.py's names)")
    ap.add_argument("--types", nargs="+", default=["Q4_0"], help="the shape model's quantization types")
    ap.add_argument("--model-dir", default=os.path.expanduser("~/.cache/ggflow/shape-models"),
                    help="where shape models are written and kept")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="skip ggflow's untimed run of each cell before the rounds (see the module docstring)")
    args = ap.parse_args(argv)
    if not args.llama_bench:
        ap.error("no llama-bench: pass --llama-bench PATH or set LLAMA_BENCH")
    if not os.access(args.llama_bench, os.X_OK):
        ap.error(f"llama-bench {args.llama_bench!r} is not an executable file")
    for model in args.models:
        if not Path(model).is_file():
            ap.error(f"model {model!r} is not a file")
    return args


def shape_models(args: argparse.Namespace) -> list[str]:
    """The --shape model at each of --types, written (seeded F16, then llama-quantize) unless already there."""
    from make_shape_model import SHAPES, write_model
    if args.shape not in SHAPES:
        raise SystemExit(f"unknown shape {args.shape!r}: one of {', '.join(sorted(SHAPES))}")
    quantize = Path(args.llama_bench).with_name("llama-quantize")
    folder = Path(args.model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    f16 = folder / f"{args.shape}-f16.gguf"
    out = [folder / f"{args.shape}-{t.lower()}.gguf" for t in args.types]
    for path, qtype in zip(out, args.types):
        if path.exists():
            continue
        if not f16.exists():
            print(f"writing {f16} (random weights, seed 0)", file=sys.stderr)
            write_model(SHAPES[args.shape], f16)
        rc, _, err, _ = run_child([str(quantize), str(f16), str(path), qtype])
        if rc != 0:
            raise SystemExit(failure("llama-quantize", rc, err))
    f16.unlink(missing_ok=True)
    return [str(p) for p in out]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.shape:
        args.models += shape_models(args)
    if not args.models:
        from ggflow.api import default_model_path
        args.models = [default_model_path()]
    cells = {(model, t): (Samples(), Samples()) for model in args.models for t in args.threads}
    if args.warm_up:
        for model, threads in cells:
            problem = warm_up_ggflow(model, args, threads)
            print(f"warm-up: {Path(model).name} -t {threads} {problem or 'done'}", file=sys.stderr)
    for round_no in range(args.rounds):
        for (model, threads), (theirs, ours) in cells.items():
            # Alternate which engine goes first, so neither always runs after the other's warm caches.
            runs = [lambda: bench_llamacpp(args.llama_bench, model, args, threads, theirs),
                    lambda: bench_ggflow(model, args, threads, ours)]
            for run in runs if round_no % 2 == 0 else runs[::-1]:
                run()
            print(f"round {round_no + 1}/{args.rounds}: {Path(model).name} -t {threads} done, load average "
                  f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(table(cells, args))
    for (model, threads), (theirs, ours) in cells.items():
        for engine, samples in (("llama.cpp", theirs), ("ggflow", ours)):
            for error in samples.errors:
                print(f"{Path(model).name} -t {threads} {engine}: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
