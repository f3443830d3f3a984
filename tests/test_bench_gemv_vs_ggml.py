"""benchmarks/bench_gemv_vs_ggml.py: blocks in rotating order, warm-up calls left out, ratios block pair by block
pair, refused arguments, a shim that does not build. ggml itself is not here (it needs a llama.cpp build); the
script's ggml path was run by hand against one (docs/performance.md, "Fifteenth session")."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gemv_vs_ggml.py"


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.setenv("GOMP_SPINCOUNT", "100000")      # the script's setdefault must not touch this process's
    spec = importlib.util.spec_from_file_location("bench_gemv_vs_ggml", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def fake_ggml(tmp_path, with_lib: bool = True) -> Path:
    """A llama.cpp tree as parse_args checks it: ggml/include/ggml.h and build/bin/libggml-cpu.so, empty."""
    (tmp_path / "ggml" / "include").mkdir(parents=True)
    (tmp_path / "ggml" / "include" / "ggml.h").write_text("")
    (tmp_path / "build" / "bin").mkdir(parents=True)
    if with_lib:
        (tmp_path / "build" / "bin" / "libggml-cpu.so").write_bytes(b"")
    return tmp_path


def test_blocks_rotate_and_leave_out_the_warm_calls(bench, monkeypatch):
    # a fake clock that each call moves on by its cost; a block's first call is slow (a pool waking up) and
    # must not reach the block's median
    clock, order, seen = [0.0], [], []
    costs = {"ggml": [5.0, 1.0, 1.0, 1.0], "ggflow": [9.0, 2.0, 2.0, 2.0]}

    def runner(name):
        def run(call):
            clock[0] += costs[name][order.count(name) % 4]
            order.append(name)
            seen.append(call)
        return run
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    paused = []
    medians = bench.blocks({name: runner(name) for name in costs}, 3, 4, warm=1,
                           after={"ggml": lambda: paused.append(len(order))})
    assert order == ["ggml"] * 4 + ["ggflow"] * 8 + ["ggml"] * 8 + ["ggflow"] * 4
    assert seen == list(range(24))                  # the running call index picks the copy
    assert medians == {"ggml": [1.0, 1.0, 1.0], "ggflow": [2.0, 2.0, 2.0]}
    assert paused == [4, 16, 20]                    # after each of ggml's blocks, not ggflow's


def test_ratios_are_taken_block_pair_by_block_pair(bench):
    # the host halves its rate for the last two block pairs; ggflow is 1.25x ggml in every pair
    medians = {"ggml": [1.0, 1.0, 2.0, 2.0], "ggflow": [0.8, 0.8, 1.6, 1.6]}
    r = bench.summary(medians, nbytes=10**9)
    assert r["ratio"] == pytest.approx(1.25)
    assert r["ratio_p10"] == pytest.approx(1.25) and r["ratio_p90"] == pytest.approx(1.25)
    assert r["ggml_gbs"] == pytest.approx(1 / 1.5) and r["ggflow_gbs"] == pytest.approx(1 / 1.2)
    # ggflow twice ggml's speed in two of three pairs: the median of pairs says 2, while the two sides'
    # medians taken apart (1 s against 2 s) would say 0.5
    skewed = bench.summary({"ggml": [1.0, 1.0, 4.0], "ggflow": [0.5, 2.0, 2.0]}, nbytes=1)
    assert skewed["ratio"] == pytest.approx(2.0) and skewed["ratio_p10"] < 1.0


def test_row_copies_differ_and_keep_every_row(bench):
    q = np.arange(12, dtype=np.uint8).reshape(4, 3)
    copies = bench.row_copies(q, 3)
    assert len({c.tobytes() for c in copies}) == 3
    for c in copies:
        assert sorted(map(bytes, c)) == sorted(map(bytes, q)) and c.flags.c_contiguous


@pytest.mark.parametrize("argv, message", [
    (["--type", "Q4_X"], "unknown type"),
    (["--calls", "10"], "more than the 10 warm-up calls"),
    (["--copies", "300"], "1..256"),
    (["--blocks", "1"], "--blocks at least 2"),
    (["--type", "Q4_K", "--k", "2080"], "multiple of 256"),
    (["--threads", "999"], "this machine's CPUs"),
])
def test_bad_arguments_are_refused_with_what_is_wrong(bench, tmp_path, capsys, argv, message):
    root = fake_ggml(tmp_path)
    with pytest.raises(SystemExit):
        bench.parse_args(argv + ["--ggml-dir", str(root)])
    assert message in capsys.readouterr().err


def test_no_ggml_is_refused_before_anything_runs(bench, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GGML_DIR", raising=False)
    with pytest.raises(SystemExit):
        bench.parse_args([])
    assert "set GGML_DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--ggml-dir", str(fake_ggml(tmp_path, with_lib=False))])
    assert "no libggml-cpu" in capsys.readouterr().err


def test_a_shim_that_does_not_build_ends_the_run_with_the_compilers_words(bench, tmp_path, capsys):
    root = fake_ggml(tmp_path)      # ggml.h alone, and empty: the compiler stops at the shim's other includes
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--type", "Q4_0", "--ggml-dir", str(root), "--blocks", "2", "--calls", "11"])
    text = str(exit_.value)
    assert text.startswith("error: Q4_0:") and "compiling the ggml shim" in text
