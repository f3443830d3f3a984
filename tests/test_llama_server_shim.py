"""benchmarks/llama_server_shim.py: llama-server's flags (as llama.cpp's tests/utils.py passes them) onto
ggflow serve's, checked against ggflow serve's own parser; unmappable models and flags are refused by name."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("llama_server_shim", ROOT / "benchmarks" / "llama_server_shim.py")
shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shim)

# what utils.py's ServerPreset.tinyllama2() with a slot save path starts
TINYLLAMA = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--offline",
             "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size", "32", "--no-slots", "--alias",
             "tinyllama-2", "--ctx-size", "512", "--parallel", "2", "--n-predict", "64", "--slot-save-path", "/tmp/s",
             "--no-jinja", "--reasoning-format", "deepseek"]


def test_tinyllama_preset_maps_onto_ggflow_serve_flags_its_parser_takes():
    from ggflow.cli import build_parser

    known = shim._ggflow_serve_flags()
    args = shim.ggflow_argv(TINYLLAMA, known)
    assert args == ["--port", "8080", "--host", "127.0.0.1", "-b", "32", "--alias", "tinyllama-2", "-c", "512",
                    "-np", "2", "-n", "64", "--slot-save-path", "/tmp/s", "--reasoning-format", "deepseek"]
    parsed = build_parser().parse_args(["serve", *args])
    assert (parsed.parallel, parsed.ctx_size, parsed.max_tokens_cap, parsed.slot_save_path) == (2, 512, 64, "/tmp/s")


@pytest.mark.parametrize("argv, words", [
    (["--hf-repo", "ggml-org/stories15M_MOE", "--hf-file", "stories15M_MOE-F16.gguf"], "no offline copy"),
    (["--hf-repo", "ggml-org/tinygemma3-GGUF:Q8_0"], "vision"),
    (["--hf-repo", "someone/else"], "no local mapping"),
    (["--grp-attn-n", "2"], "--grp-attn-n"),
    (["--mmproj-url", "http://x"], "--mmproj-url"),
    (["--some-new-flag"], "--some-new-flag"),
])
def test_unmappable_models_and_flags_are_refused_by_name(argv, words):
    with pytest.raises(shim.ShimError, match=words.replace("-", r"\-")):
        shim.ggflow_argv(argv, shim._ggflow_serve_flags())


def test_the_shim_exits_3_naming_why():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llama_server_shim.py"), "--hf-repo",
                        "ggml-org/models", "--hf-file", "bert-bge-small/ggml-model-f16.gguf"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 3 and "bert-bge-small: no offline copy" in r.stderr


def test_n_predict_minus_one_is_no_cap():
    args = shim.ggflow_argv(["--n-predict", "-1", "--ctx-size", "64"], shim._ggflow_serve_flags())
    assert args == ["-c", "64"]
