"""benchmarks/bench_vs_llamacpp.py: the table from both engines' reports, and ggflow's untimed warm-up run of each
cell before the rounds (a round that compiled kernels counted LLVM's memory in ggflow's peak RSS). The children
are stood in for (run_child), so no llama-bench is needed."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vs_llamacpp.py"


@pytest.fixture()
def bench(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)     # its dataclasses look their module up there
    spec.loader.exec_module(module)
    binary = tmp_path / "llama-bench"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    calls = []

    def run_child(cmd):
        calls.append(cmd)
        threads = int(cmd[cmd.index("-t") + 1])
        if cmd[0] == str(binary):
            out = [{"n_prompt": 64, "n_gen": 0, "samples_ts": [100.0 * threads]},
                   {"n_prompt": 0, "n_gen": 32, "samples_ts": [50.0 * threads]}]
            return 0, json.dumps(out), "", 131.0
        repetitions = int(cmd[cmd.index("-r") + 1])
        warm_up = repetitions == 1          # the rounds below run -r 2 or 3
        report = {"results": [{"test": "pp64", "runs": [200.0] * repetitions},
                              {"test": "tg32", "runs": [40.0 if warm_up else 60.0] * repetitions}],
                  "peak_rss_mb": 999.0 if warm_up else 208.0}   # a warm-up that compiled: LLVM's memory
        return 0, json.dumps(report), "", 0.0

    monkeypatch.setattr(module, "run_child", run_child)
    return module, str(binary), str(model), calls


def test_each_cell_is_warmed_up_once_before_the_rounds_and_left_out_of_the_table(bench, capsys):
    module, binary, model, calls = bench
    module.main([model, "--llama-bench", binary, "--threads", "1", "2", "--rounds", "2", "-r", "3"])
    warm_ups, rounds = calls[:2], calls[2:]
    assert [c[c.index("-t") + 1] for c in warm_ups] == ["1", "2"]
    assert all(c[0] != binary and c[c.index("-r") + 1] == "1" for c in warm_ups)
    assert len(rounds) == 2 * 2 * 2 and all(c[c.index("-r") + 1] == "3" for c in rounds)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| m.gguf")]
    assert rows == ["| m.gguf | 1 | 100.0 | 200.0 | 2.00 | 50.0 | 60.0 | 1.20 | 131 / 208 |",
                    "| m.gguf | 2 | 200.0 | 200.0 | 1.00 | 100.0 | 60.0 | 0.60 | 131 / 208 |"]


def test_no_warm_up_runs_only_the_rounds(bench):
    module, binary, model, calls = bench
    module.main([model, "--llama-bench", binary, "--threads", "1", "--rounds", "1", "-r", "2", "--no-warm-up"])
    assert len(calls) == 2 and all(c[c.index("-r") + 1] == "2" for c in calls)


def test_ggflow_runs_from_the_callers_pythonpath_wherever_it_is_started(monkeypatch, tmp_path):
    """PYTHONPATH=<another checkout> measures that checkout, also when run from this one's directory (where
    ``python -m`` would put this checkout's ggflow first)."""
    other = tmp_path / "other"
    (other / "ggflow" / "cli").mkdir(parents=True)
    (other / "ggflow" / "__init__.py").write_text("")
    (other / "ggflow" / "cli" / "__init__.py").write_text("")
    report = {"results": [{"test": "pp64", "runs": [123.0]}, {"test": "tg32", "runs": [45.0]}], "peak_rss_mb": 7.0}
    (other / "ggflow" / "cli" / "__main__.py").write_text(f"print({json.dumps(report)!r})\n")
    monkeypatch.setenv("PYTHONPATH", str(other))
    monkeypatch.chdir(SCRIPT.parents[1])
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    args = argparse.Namespace(n_prompt=64, n_gen=32, n_depth=0, repetitions=1)
    into = module.Samples()
    module.bench_ggflow("m.gguf", args, 1, into)
    assert (into.pp, into.tg, into.rss_mib, into.errors) == ([123.0], [45.0], [7.0], [])
