"""Time to first token of README's first command, cold (nothing compiled) and warm (all cached).

    python benchmarks/bench_first_run.py [--runs 2] [--model PATH] [--kernels] [-- extra ggflow run args]

Cold: a fresh copy of the ggflow package (empty __pycache__) and an empty NUMBA_CACHE_DIR, so Python
bytecode and every numba kernel compile, as after `pip install`. Warm: the same command again, in the
same copy and cache. "first token" is from the process start to the first byte on stdout past the echoed
prompt: import + load + prompt evaluation + first sample. Each figure is
given as wall time and as the process's CPU time (user + system), which a busy machine inflates far less.
--kernels also lists what compiled, with seconds per kernel (numba's compile events, nested compiles
counted inside their caller).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_ARGS = ["run", "-p", "The three primary colors are", "-n", "48", "--temp", "0"]

# Runs ggflow's main with a listener that records each top-level compile's kernel and seconds.
LISTENING_MAIN = """
import json, sys, time
from numba.core import event
from ggflow.cli import main
def kernel_name(d):
    return f"{d.py_func.__module__.removeprefix('ggflow.backends_builtin.')}.{d.py_func.__qualname__}"
records, depth, t0 = [], [0], [0.0]
class Timer(event.Listener):
    def on_start(self, ev):
        depth[0] += 1
        if depth[0] == 1:
            t0[0] = time.perf_counter()
    def on_end(self, ev):
        depth[0] -= 1
        if depth[0] == 0:
            records.append((kernel_name(ev.data["dispatcher"]), str(ev.data["args"]), time.perf_counter() - t0[0]))
event.register("numba:compile", Timer())
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(records, f)
sys.exit(rc)
"""


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(argv: list[str], env: dict[str, str], cwd: str, echo: str) -> dict[str, float]:
    cpu0 = children_cpu_seconds()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    first = b""
    while len(first) <= len(echo.encode()):  # the prompt may be echoed before the first token
        chunk = os.read(proc.stdout.fileno(), 1 << 16)
        if not chunk:
            break
        first += chunk
    t_first, cpu_first = time.perf_counter() - t0, cpu_seconds(proc.pid)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.decode()}")
    return {"first_token_s": t_first, "first_token_cpu_s": cpu_first, "total_s": time.perf_counter() - t0,
            "total_cpu_s": children_cpu_seconds() - cpu0, "stderr": err.decode(), "stdout": (first + out).decode()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="warm runs after the cold one")
    parser.add_argument("--model", default=None)
    parser.add_argument("--kernels", action="store_true", help="list what compiled in the cold run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy and cache")
    parser.add_argument("--source", default=str(REPO / "ggflow"),
                        help="the ggflow package directory to copy (e.g. an older commit's, from git archive)")
    parser.add_argument("extra", nargs="*", help="more `ggflow run` arguments (after --)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ggflow-first-run-"))
    shutil.copytree(args.source, work / "ggflow", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(work), NUMBA_CACHE_DIR=str(work / "numba-cache"), PYTHONDONTWRITEBYTECODE="")
    run_args = README_ARGS + (["-m", args.model] if args.model else []) + args.extra
    records = work / "kernels.json"
    results = []
    for i in range(1 + args.runs):
        argv = ([sys.executable, "-c", LISTENING_MAIN, str(records)] if args.kernels and i == 0
                else [sys.executable, "-m", "ggflow.cli"]) + run_args
        r = timed_run(argv, env, str(work), echo=run_args[run_args.index("-p") + 1])
        label = "cold" if i == 0 else f"warm {i}"
        timing_lines = [line for line in r["stderr"].splitlines() if line.startswith(("prompt eval", "eval"))]
        print(f"{label}: first token {r['first_token_s']:.1f} s ({r['first_token_cpu_s']:.1f} s CPU), whole command "
              f"{r['total_s']:.1f} s ({r['total_cpu_s']:.1f} s CPU); " + " | ".join(timing_lines))
        results.append({"run": label, **{k: round(v, 2) for k, v in r.items() if k.endswith("_s")}})
    if args.kernels:
        compiled = json.loads(records.read_text())
        total = sum(s for _, _, s in compiled)
        print(f"\n{len(compiled)} top-level compiles, {total:.1f} s:")
        for name, sig, seconds in sorted(compiled, key=lambda r: -r[2]):
            print(f"  {seconds:6.2f} s  {name}{sig}")
    print(json.dumps({"load_average": os.getloadavg(), "results": results}))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
