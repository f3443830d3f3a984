"""benchmarks/bench_overhead.py runs and measures what it says: a reused decode graph (it reads the Context's
kept graphs, whose shape changed once without this test noticing)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_overhead.py"


def test_bench_overhead_reports_a_reused_decode_graph():
    steps = 25
    done = subprocess.run([sys.executable, str(SCRIPT), "--layers", "2", "--steps", str(steps), "--by-kernel"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"(\d+) layers, F32 weights, (\d+) graph nodes, (\d+) kernels, (\d+) reuses: "
                      r"median ([\d.]+) ms per decode step, plan ([\d.]+) ms", done.stdout)
    assert found, done.stdout
    layers, nodes, kernels, reuses = (int(found.group(i)) for i in range(1, 5))
    step_ms, plan_ms = float(found.group(5)), float(found.group(6))
    assert layers == 2 and 0 < kernels < nodes
    assert reuses == steps - 1              # every decode step after the first reused its graph
    assert step_ms > 0 and plan_ms > 0     # measured (no timing compared: the machines are noisy)
    # --by-kernel: the kernels timed alone, by kind, as many as the plan has
    kinds = re.findall(r"^\s*[\d.]+ us\s+(\d+) x\s+[\d.]+ us\s+(\S+)$", done.stdout, re.M)
    assert sum(int(count) for count, _ in kinds) == kernels, done.stdout
    assert any("attention" in name for _, name in kinds), done.stdout
