"""benchmarks/bench_decode_paired.py: rounds in rotating order, ratios taken round by round, the variants' worker
protocol on a real (tiny) model; llama-bench is stood in for."""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_decode_paired.py"


@pytest.fixture()
def paired(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_decode_paired", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def stand_ins(tmp_path, llama_script: str = "exit 1") -> tuple[str, str]:
    """A llama-bench that runs llama_script and a model file for parse_args to accept: (binary, model)."""
    binary = tmp_path / "llama-bench"
    binary.write_text(f"#!/bin/sh\n{llama_script}\n")
    binary.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return str(binary), str(model)


def fake_variants(speeds, closed: list[str]):
    """A Variant stand-in whose runs return the next of ``speeds`` and that records its close."""
    class FakeVariant:
        def __init__(self, name, env, args):
            self.name, self.source = name, "/checkout"

        def run(self):
            return next(speeds)

        def close(self):
            closed.append(self.name)
    return FakeVariant


def test_each_round_runs_everyone_once_in_an_order_that_rotates(paired):
    order = []
    runners = {name: (lambda name=name: order.append(name) or 1.0) for name in "abc"}
    speeds = paired.rounds(runners, 4, report=lambda line: None)
    assert order == list("abc" "bca" "cab" "abc")
    assert speeds == {name: [1.0] * 4 for name in "abc"}


def test_ratios_are_taken_round_by_round_not_from_the_medians(paired):
    # the host slows down by half in rounds 3-4: each pair still says 0.9
    speeds = {"llama.cpp": [50.0, 50.0, 25.0, 25.0, 25.0], "ggflow": [45.0, 45.0, 22.5, 22.5, 22.5]}
    rows = paired.summary(speeds)
    assert rows[2] == "| llama.cpp | 25.0 | 1.00 | 1.00-1.00 |"
    assert rows[3] == "| ggflow | 22.5 | 0.90 | 0.90-0.90 |"


def test_variants_parse_into_names_and_environments(paired):
    assert paired.parse_variant("old=PYTHONPATH=/a/b,NUMBA_CACHE_DIR=/c") == (
        "old", {"PYTHONPATH": "/a/b", "NUMBA_CACHE_DIR": "/c"})
    assert paired.parse_variant("plain=") == ("plain", {})
    for bad in ("=X=1", "v=X", "v==1"):
        with pytest.raises(argparse.ArgumentTypeError):
            paired.parse_variant(bad)


def test_arguments_that_cannot_pair_are_refused(paired, tmp_path, capsys):
    _, model = stand_ins(tmp_path)
    for argv in ([model, "--no-llama"],                                        # one variant, nothing to pair
                 [model, "--no-llama", "--variant", "a=", "--variant", "a=X=1"],  # one name twice
                 [str(tmp_path / "missing.gguf"), "--no-llama", "--variant", "a=", "--variant", "b="],
                 [model, "--llama-bench", str(tmp_path / "no-such-binary")]):
        with pytest.raises(SystemExit):
            paired.parse_args(argv)
    assert "error:" in capsys.readouterr().err


def test_a_variant_worker_loads_once_and_decodes_on_each_request(paired, tiny_model_path):
    args = paired.parse_args([str(tiny_model_path("llama")), "--no-llama", "--variant", "a=", "--variant", "b=",
                              "-t", "1", "-n", "4"])
    variant = paired.Variant("a", {"GGFLOW_FOLLOW_LOAD": "0"}, args)
    try:
        speeds = [variant.run() for _ in range(2)]
    finally:
        variant.close()
    assert variant.proc.returncode == 0                  # stdin closed: the worker left on its own
    assert Path(variant.source, "ggflow").is_dir()       # it says which checkout it runs
    assert all(s > 0 for s in speeds)


def test_main_prints_the_table_with_llama_bench_stood_in(paired, tmp_path, monkeypatch, capsys):
    binary, model = stand_ins(tmp_path)
    llama_speeds = itertools.cycle([40.0, 20.0])
    closed = []
    monkeypatch.setattr(paired, "Variant", fake_variants(itertools.cycle([36.0, 18.0]), closed))
    monkeypatch.setattr(paired, "run_llama", lambda *a: next(llama_speeds))
    paired.main([model, "--llama-bench", binary, "--rounds", "4"])
    out = capsys.readouterr().out
    assert "| ggflow | 27.0 | 0.90 | 0.90-0.90 |" in out
    assert closed == ["ggflow"]


def test_a_failing_llama_bench_ends_the_run_with_its_error_and_the_workers_closed(paired, tmp_path, monkeypatch):
    binary, model = stand_ins(tmp_path, "echo 'error: unknown model architecture' >&2\nexit 1")
    closed = []
    monkeypatch.setattr(paired, "Variant", fake_variants(itertools.repeat(30.0), closed))
    with pytest.raises(SystemExit) as exit_info:
        paired.main([model, "--llama-bench", binary, "--rounds", "2"])
    assert "llama-bench exit 1" in str(exit_info.value.code) and "unknown model architecture" in str(exit_info.value.code)
    assert closed == ["ggflow"]
