"""ggflow bench under each numba threading layer and OpenMP wait policy, interleaved, at 1 and 2 threads.

Every round runs every (setting, threads) once in turn, so drifting load hits all settings alike; a cell is
the median of its repetitions over all rounds. The tbb layer needs libtbb.so.12 on the loader's path
(``pip install tbb`` puts it in the environment's lib/, added to LD_LIBRARY_PATH here); a setting whose layer
does not load is reported as failed, not skipped silently.
    python benchmarks/bench_threads.py [-m MODEL] [--threads 1 2] [--rounds 3] [-r 3] [--settings NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ENV_LIB = str(Path(sys.prefix) / "lib")

# name -> environment overrides; "default" is what ggflow gets with nothing set (passive, ggflow/_numba_setup.py).
# "omp spin" is libgomp's own default (spin 300000 rounds, then sleep): a spin count of the user's keeps
# ggflow from setting the policy, and 300000 is what libgomp uses when OMP_WAIT_POLICY is unset.
SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "omp spin": {"NUMBA_THREADING_LAYER": "omp", "GOMP_SPINCOUNT": "300000"},
    "omp": {"NUMBA_THREADING_LAYER": "omp"},
    "omp passive": {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "passive"},
    "omp active": {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "active"},
    "omp spin 30k": {"NUMBA_THREADING_LAYER": "omp", "GOMP_SPINCOUNT": "30000"},
    "omp spin 100k": {"NUMBA_THREADING_LAYER": "omp", "GOMP_SPINCOUNT": "100000"},
    "workqueue": {"NUMBA_THREADING_LAYER": "workqueue"},
    "tbb": {"NUMBA_THREADING_LAYER": "tbb", "LD_LIBRARY_PATH": ENV_LIB},
}
# Knobs set on the cleaned environment: a user's own values would make the rows lie.
CLEARED = ("NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def bench(model: str | None, threads: int, env: dict[str, str], args: argparse.Namespace) -> dict | str:
    cmd = [sys.executable, "-m", "ggflow.cli", "bench", "-t", str(threads), "-p", str(args.n_prompt),
           "-n", str(args.n_gen), "-r", str(args.repetitions), "--json"] + (["-m", model] if model else [])
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    proc = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = ap.parse_args()
    cells = {(name, t): {"pp": [], "tg": [], "errors": []} for name in args.settings for t in args.threads}
    for round_no in range(args.rounds):
        for (name, threads), cell in cells.items():
            report = bench(args.model, threads, SETTINGS[name], args)
            if isinstance(report, str):
                cell["errors"].append(report)
                continue
            for result in report["results"]:
                cell[result["test"][:2]].extend(result["runs"])
        print(f"round {round_no + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(f"| setting | threads | pp{args.n_prompt} t/s | tg{args.n_gen} t/s |")
    print("|---|---|---|---|")
    for (name, threads), cell in cells.items():
        pp, tg = (f"{statistics.median(cell[k]):.1f}" if cell[k] else "failed" for k in ("pp", "tg"))
        print(f"| {name} | {threads} | {pp} | {tg} |")
    for (name, threads), cell in cells.items():
        for error in dict.fromkeys(cell["errors"]):
            print(f"{name} -t {threads}: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
