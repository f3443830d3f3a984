"""The ggflow command as a new user meets it: bad values are one line and exit 2, -c 0 and -n -1 mean what
llama.cpp means by them, chat outlives a full context, Ctrl-C is one line and 130, compiles are announced."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ggflow.cli import main
from tests.fixtures.default_model import needs_model

REPO = Path(__file__).resolve().parents[1]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


# -- bad values: one line naming the option, the value and what is accepted ----------------------------
@pytest.mark.parametrize("argv, option, value, accepted", [
    (["run", "-n", "-2"], "-n/--n-predict", "-2", ">= -1"),
    (["run", "-c", "-1"], "-c/--ctx-size", "-1", ">= 0"),
    (["run", "-c", "lots"], "-c/--ctx-size", "'lots'", "an integer >= 0"),
    (["run", "-b", "0"], "-b/--ubatch-size", "0", ">= 1"),
    (["run", "-t", "0"], "-t/--threads", "0", ">= 1"),
    (["chat", "-n", "-5"], "-n/--n-predict", "-5", ">= -1"),
    (["run", "--cache-type-k", "q9"], "--cache-type-k", "'Q9'", "'F16', 'F32'"),
    (["bench", "-r", "0"], "-r/--repetitions", "0", ">= 1"),
    (["bench", "-p", "-1"], "-p/--n-prompt", "-1", ">= 0"),
    (["bench", "-d", "-3"], "-d/--n-depth", "-3", ">= 0"),
    (["warmup", "-b", "0"], "-b/--ubatch-size", "0", ">= 1"),
    (["serve", "-np", "0"], "-np/--parallel", "0", ">= 1"),
    (["serve", "--port", "70000"], "--port", "70000", "0..65535"),
])
def test_a_bad_value_is_one_line_naming_option_value_and_what_is_accepted(capsys, argv, option, value, accepted):
    assert main(argv) == 2
    line = one_line_error(capsys)
    assert option in line and value in line and accepted in line


def test_an_unknown_option_is_one_line_too(capsys):
    assert main(["run", "--no-such-option"]) == 2
    assert "--no-such-option" in one_line_error(capsys)


def test_a_directory_as_the_model_is_called_a_directory(tmp_path, capsys):
    assert main(["run", "-m", str(tmp_path), "-n", "1"]) == 2
    line = one_line_error(capsys)
    assert "is a directory" in line and str(tmp_path) in line and "no such file" not in line


def test_a_directory_as_quantize_input_is_called_a_directory(tmp_path, capsys):
    assert main(["quantize", str(tmp_path), str(tmp_path / "out.gguf"), "Q8_0"]) == 2
    line = one_line_error(capsys)
    assert "IN.gguf" in line and "is a directory" in line and not (tmp_path / "out.gguf").exists()


def test_a_missing_model_is_no_such_file(tmp_path, capsys):
    assert main(["info", "-m", str(tmp_path / "absent.gguf")]) == 2
    assert "no such file" in one_line_error(capsys)


def test_a_context_too_large_for_memory_is_refused_before_allocating(tiny_model_path, capsys):
    assert main(["run", "-m", str(tiny_model_path("llama")), "-c", "1000000000000", "-n", "1"]) == 2
    line = one_line_error(capsys)
    assert "-c/--ctx-size 1000000000000" in line and "GiB" in line and "0 (the training context, 256)" in line


def test_quantize_in_onto_itself_is_refused_and_the_input_kept(tiny_model_path, tmp_path, capsys):
    path = tmp_path / "model.gguf"
    path.write_bytes(Path(tiny_model_path("llama")).read_bytes())
    before = path.read_bytes()
    (tmp_path / "link.gguf").symlink_to(path)
    for out in (path, tmp_path / "link.gguf"):
        assert main(["quantize", str(path), str(out), "Q8_0", "-q"]) == 2
        assert "never overwrites its input" in one_line_error(capsys)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["link.gguf", "model.gguf"]


def test_running_out_of_memory_anyway_is_one_line(tiny_model_path, monkeypatch, capsys):
    from ggflow.cli import run_cmd

    def no_memory(args):
        raise MemoryError("Unable to allocate 3.7 TiB for an array")
    monkeypatch.setattr(run_cmd, "load_llm", no_memory)
    assert main(["run", "-m", str(tiny_model_path("llama"))]) == 2
    line = one_line_error(capsys)
    assert "out of memory" in line and "3.7 TiB" in line and "-c/--ctx-size" in line


# -- -c 0 and -n -1 --------------------------------------------------------------------------------------
def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_ctx_0_is_the_training_context_and_n_minus_1_runs_until_it_is_full(tiny_model_path, capsys):
    # The tiny qwen2's training context is 256; from this prompt its random weights, decoded greedily, repeat
    # one token that is not the end of text, so only the context ends the generation.
    out = run_json(capsys, ["run", "-m", str(tiny_model_path("qwen2")), "--prompt-ids", "1,5,9", "-c", "0",
                            "-n", "-1", "--temp", "0", "--json"])
    assert out["finish_reason"] == "length"
    # Every cell holds a token, and the last sampled token is the one that no longer fits.
    assert len(out["prompt_tokens"]) + len(out["tokens"]) == 256 + 1


def test_n_minus_1_stops_at_a_smaller_explicit_context(tiny_model_path, capsys):
    out = run_json(capsys, ["run", "-m", str(tiny_model_path("qwen2")), "--prompt-ids", "1,5,9", "-c", "40",
                            "-n", "-1", "--temp", "0", "--json"])
    assert len(out["tokens"]) == 40 - 3 + 1 and out["finish_reason"] == "length"


# -- chat outgrowing its context --------------------------------------------------------------------------
def test_chat_drops_the_oldest_turns_instead_of_ending(tiny_model_path, monkeypatch, capsys):
    turns = [f"turn {i}: the heat" for i in range(8)]  # the tiny vocabulary spends a token per letter or so
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(t + "\n" for t in turns)))
    assert main(["chat", "-m", str(tiny_model_path("llama")), "-c", "256", "-n", "16", "--temp", "0",
                 "-s", "be brief"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) >= len(turns)  # every turn got its (possibly empty) reply line
    notes = [line for line in captured.err.splitlines() if line.startswith("ggflow chat:")]
    assert notes and all("dropped the oldest" in n and "system prompt is kept" in n for n in notes)
    assert "error" not in captured.err


def test_chat_fit_keeps_the_system_prompt_and_the_newest_turn():
    from ggflow.cli.chat_cmd import fit_context

    class CountingLLM:  # a token per word, a context of 20
        n_ctx = 20

        def chat_template(self):
            return self

        def render(self, messages, add_generation_prompt=True):
            return " ".join(m["content"] for m in messages)

        def tokenize(self, text, parse_special=False):
            return text.split()

    messages = [{"role": "system", "content": "s"}] + [
        {"role": r, "content": f"{r[0]}{i} " * 4} for i in range(3) for r in ("user", "assistant")]
    messages.append({"role": "user", "content": "newest question"})
    assert fit_context(CountingLLM(), messages, 1, room=5)
    assert messages[0]["content"] == "s" and messages[-1]["content"] == "newest question"
    assert sum(len(m["content"].split()) for m in messages) + 5 <= 20
    assert messages[1]["role"] == "user"  # whole turns are dropped, never half of one


# -- Ctrl-C: exit 130, one line, at any point --------------------------------------------------------------
def without_compile_notice(stderr: str) -> list[str]:
    """stderr's lines but the compile notice, which a run prints when its kernels are not cached yet."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("ggflow: compiling")]


def interrupt(argv: list[str], when: str, env: dict | None = None, timeout: float = 240, min_bytes: int = 1
              ) -> tuple[int, str]:
    """Run ggflow, send SIGINT once `when` ("stdout" or "stderr") has shown min_bytes, return (rc, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "ggflow.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, **(env or {})})
    watched = proc.stdout if when == "stdout" else proc.stderr
    watchdog = threading.Timer(timeout, proc.kill)  # a process that never writes must not hang the test
    watchdog.start()
    try:
        first = b""
        while len(first) < min_bytes:  # unbuffered reads, so communicate() below gets all that follows
            chunk = os.read(watched.fileno(), 1 << 16)
            assert chunk, f"the process ended (rc {proc.poll()}) before writing {min_bytes} bytes: {first!r}"
            first += chunk
    finally:
        watchdog.cancel()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, (first.decode() if watched is proc.stderr else "") + err.decode()


@needs_model
def test_ctrl_c_during_generation_exits_130_with_one_line():
    prompt = "Once upon a time, in a land far away, there lived"  # greedy: a long story, no early end
    rc, err = interrupt(["run", "-n", "-1", "-c", "2048", "--temp", "0", "-p", prompt], "stdout",
                        min_bytes=len(prompt) + 20)
    assert rc == 130 and "Traceback" not in err
    assert without_compile_notice(err) == ["interrupted"]


@needs_model
def test_ctrl_c_while_kernels_compile_exits_130_with_one_line_after_the_notice(tmp_path):
    # An empty numba cache: the run compiles, announces it on stderr, and is interrupted right then.
    rc, err = interrupt(["run", "-n", "4"], "stderr", env={"NUMBA_CACHE_DIR": str(tmp_path)})
    lines = err.strip().splitlines()
    assert rc == 130 and "Traceback" not in err and "SystemError" not in err
    assert lines[-1] == "interrupted" and len(lines) == 2 and lines[0].startswith("ggflow: compiling")


LOAD_THEN_SAY_READY = """
import sys
from ggflow.cli import main, run_cmd
load = run_cmd.load_llm
def announcing_load(args):
    print("loading", flush=True)
    return load(args)
run_cmd.load_llm = announcing_load
sys.exit(main(["run", "-n", "8"]))
"""


@needs_model
def test_ctrl_c_while_loading_exits_130_with_one_line():
    proc = subprocess.Popen([sys.executable, "-c", LOAD_THEN_SAY_READY], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout.readline().strip() == b"loading"  # the model load has begun
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and without_compile_notice(err.decode()) == ["interrupted"]


# -- first run: compiles are announced and counted ---------------------------------------------------------
def test_a_compile_is_announced_once_on_stderr_and_timed():
    import numba

    from ggflow.cli.compile_notice import CompileNotice, compile_seconds

    @numba.njit(cache=False)
    def plus_one(x):
        return x + 1

    @numba.njit(cache=False)
    def twice(x):
        return plus_one(x) * 2

    stream = io.StringIO()
    with CompileNotice(stream) as notice:
        assert twice(1) == 4 and twice(2.5) == 7.0  # two signatures: two compiles, one line
        assert compile_seconds() == notice.seconds > 0
        assert notice.kernels == 2  # plus_one compiles inside twice's compile: counted in it, once
        twice(3)  # compiled already: nothing new
        assert notice.kernels == 2
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "compiling CPU kernels" in lines[0] and "twice" in lines[0] and "once" in lines[0]
    assert compile_seconds() == 0.0  # the notice listens only while a command runs


def test_on_a_terminal_compiles_show_as_a_bar_naming_the_kernel_that_is_cleared_before_output(monkeypatch):
    import numba

    from ggflow.cli.compile_notice import CompileNotice, end_progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "160")  # tqdm sizes the bar to the terminal

    @numba.njit(cache=False)
    def minus_one(x):
        return x - 1

    screen = Terminal()
    with CompileNotice(screen):
        minus_one(3)
        end_progress()
        shown = screen.getvalue()
        assert "compiling kernels (first run only)" in shown and "minus_one" in shown
        assert shown.endswith("\r")  # the bar's line is blanked, the cursor back at its start
        minus_one(2.5)  # compiles after the output began add nothing to the screen
    assert screen.getvalue() == shown


def test_compile_time_is_reported_inside_the_timing_it_belongs_to():
    from ggflow.cli.run_cmd import _compiling

    assert _compiling(51.0354) == " (of which 51035 ms compiling kernels, once)" and _compiling(0.0) == ""


# -- where numba's cache goes --------------------------------------------------------------------------------
def test_numba_cache_goes_to_the_user_cache_dir_when_the_package_is_read_only(monkeypatch, tmp_path):
    from ggflow import _numba_setup

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_numba_setup, "in_tree_cache_writable", lambda: False)
    import numba
    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)
    assert _numba_setup.choose_cache_dir() == str(tmp_path / "ggflow" / "numba")
    assert os.environ["NUMBA_CACHE_DIR"] == numba.config.CACHE_DIR == str(tmp_path / "ggflow" / "numba")


def test_numba_cache_choice_leaves_a_user_setting_and_a_writable_package_alone(monkeypatch, tmp_path):
    from ggflow import _numba_setup

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(_numba_setup, "in_tree_cache_writable", lambda: False)
    assert _numba_setup.choose_cache_dir() is None and os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setattr(_numba_setup, "in_tree_cache_writable", lambda: True)
    assert _numba_setup.choose_cache_dir() is None and "NUMBA_CACHE_DIR" not in os.environ


@pytest.mark.integration
@needs_model
def test_warmup_compiles_so_the_next_run_compiles_nothing(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    warm = subprocess.run([sys.executable, "-m", "ggflow.cli", "warmup"], capture_output=True, text=True,
                          cwd=REPO, timeout=600, env=env)
    assert warm.returncode == 0, warm.stderr
    assert "compiling kernels" in warm.stderr.splitlines()[-1] and "all were cached" not in warm.stderr
    after = subprocess.run([sys.executable, "-m", "ggflow.cli", "run", "-n", "4", "-c", "64"],
                           capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert after.returncode == 0 and "compiling" not in after.stderr, after.stderr


def test_a_command_freezes_what_it_loaded_out_of_the_collectors_full_passes(tiny_model_path, capsys):
    import gc
    gc.unfreeze()
    assert main(["bench", "-m", str(tiny_model_path("llama")), "-p", "2", "-n", "2", "-r", "1", "-t", "1"]) == 0
    assert gc.get_freeze_count() > 1000          # the model's objects and the rest of the process's heap
    gc.unfreeze()
    assert main(["run", "-m", str(tiny_model_path("llama")), "-p", "hi", "-n", "2", "-t", "1"]) == 0
    assert gc.get_freeze_count() > 1000


def test_bench_at_a_depth_names_its_tests_as_llama_bench_does_and_starts_each_run_there(tiny_model_path, capsys,
                                                                                     monkeypatch):
    import json

    from ggflow.core.context import Context
    starts = []
    decode = Context.decode

    def spy(self, batch):
        starts.append((int(batch.pos[0]), batch.n_tokens))
        return decode(self, batch)
    monkeypatch.setattr(Context, "decode", spy)
    assert main(["bench", "-m", str(tiny_model_path("llama")), "-p", "4", "-n", "3", "-d", "40", "-r", "2",
                 "-t", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in report["results"]] == ["pp4 @ d40", "tg3 @ d40"]
    # every CPU plan run counted under the one thread asked for: a pp decode and 3 tg decodes in each of the
    # 3 runs (warm-up + 2), and the prefix once
    assert report["cpu_plans_by_threads"] == {"1": (1 + 3) * 3 + 1}
    # the 40-token prefix once, then every run (warm-up + 2 repetitions) from position 40
    assert starts.count((0, 40)) == 1
    assert starts.count((40, 4)) == 3 and starts.count((40, 1)) == 3 and starts.count((42, 1)) == 3
