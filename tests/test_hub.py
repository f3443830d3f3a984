"""Models from the Hugging Face Hub (ggflow/api/hub.py): ``LLM.from_pretrained`` and ``-hf REPO[:QUANT]`` against a
local stand-in for the Hub (tests/fake_hub.py, 127.0.0.1), never the internet; huggingface_hub does the
downloading, so its cache, resume, token and HF_ENDPOINT are what is exercised."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("huggingface_hub")

from ggflow.api import LLM, default_model_path  # noqa: E402
from ggflow.api.hub import HubError, HubSpec, pick_model_file, resolve_hf, shards  # noqa: E402
from tests.fake_hub import COMMIT, FakeHub, hub_env, serve_hub  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"tiny-Q8_0.gguf": b"GGUF" + b"8" * 3000, "tiny-Q4_K_M.gguf": b"GGUF" + b"4" * 2000,
        "mmproj-tiny-Q4_K_M.gguf": b"GGUF-mmproj", "README.md": b"# tiny"}
SPLIT = {"big-Q4_K_M-00001-of-00003.gguf": b"GGUF1", "big-Q4_K_M-00002-of-00003.gguf": b"GGUF2",
         "big-Q4_K_M-00003-of-00003.gguf": b"GGUF3", "big-Q8_0.gguf": b"GGUF8"}


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    """The fake hub with three repos, HF_ENDPOINT pointing at it, a private cache, no token, online."""
    fake = FakeHub({"me/tiny-GGUF": TINY, "me/big-GGUF": SPLIT, "me/smol-GGUF": {
        "SmolLM2-135M-Instruct.Q4_1.gguf": default_model_path(), "SmolLM2-135M-Instruct.F16.gguf": b"GGUF"}})
    with serve_hub(fake) as url:
        for key, value in hub_env(url, str(tmp_path / "cache")).items():
            if os.environ.get(key) != value:
                monkeypatch.setenv(key, value)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        fake.url, fake.cache = url, str(tmp_path / "cache")
        yield fake


@pytest.fixture(scope="module")
def smol_tokens():
    """The default model's greedy tokens for the prompt the tests use, loaded from its file."""
    return LLM(default_model_path(), n_ctx=256, n_threads=1).generate("The capital of France is", 6,
                                                                     temperature=0).tokens


def gets(fake: FakeHub) -> list[tuple[str, str, str]]:
    return [r for r in fake.requests if r[0] == "GET" and "/resolve/" in r[1]]


# -- llama.cpp's choice of a file ---------------------------------------------------------------------------
def test_default_choice_is_q4_k_m_then_q8_0_then_the_first_gguf():
    assert pick_model_file(["a-Q8_0.gguf", "a-Q4_K_M.gguf", "a-F16.gguf"]) == "a-Q4_K_M.gguf"
    assert pick_model_file(["a-F16.gguf", "a-Q8_0.gguf"]) == "a-Q8_0.gguf"
    assert pick_model_file(["README.md", "a-F16.gguf", "a-BF16.gguf"]) == "a-F16.gguf"
    assert pick_model_file(["README.md"]) is None


def test_quant_matches_case_insensitively_and_only_whole_tags():
    files = ["x.Q4_K_M.gguf", "x.Q4_K_S.gguf", "x.Q4_K.gguf"]
    assert pick_model_file(files, "q4_k_s") == "x.Q4_K_S.gguf"
    assert pick_model_file(files, "Q4_K") == "x.Q4_K.gguf"     # not the Q4_K_M file listed first
    assert pick_model_file(files, "Q5_K_M") is None             # a named quant never falls back


def test_projectors_and_later_shards_are_never_the_model():
    files = ["mmproj-x-Q4_K_M.gguf", "x-Q4_K_M-00002-of-00002.gguf", "x-Q4_K_M-00001-of-00002.gguf"]
    assert pick_model_file(files) == "x-Q4_K_M-00001-of-00002.gguf"
    assert shards(files, "x-Q4_K_M-00001-of-00002.gguf") == ["x-Q4_K_M-00001-of-00002.gguf",
                                                            "x-Q4_K_M-00002-of-00002.gguf"]


@pytest.mark.parametrize("bad", ["noslash", "a/b/c", "/model", "a/b:Q4:K"])
def test_malformed_hf_spec_is_refused(bad):
    with pytest.raises(HubError, match="expected <user>/<model>"):
        HubSpec.parse(bad)


# -- downloads through huggingface_hub ------------------------------------------------------------------------
def test_hf_downloads_the_chosen_file_into_the_cache_once(hub):
    path = resolve_hf("me/tiny-GGUF")
    assert path.startswith(hub.cache) and f"snapshots/{COMMIT}" in path
    assert open(path, "rb").read() == TINY["tiny-Q4_K_M.gguf"]
    assert open(resolve_hf("me/tiny-GGUF:q8_0"), "rb").read() == TINY["tiny-Q8_0.gguf"]
    n_gets = len(gets(hub))
    assert resolve_hf("me/tiny-GGUF:Q8_0") == resolve_hf("me/tiny-GGUF:Q8_0")
    assert len(gets(hub)) == n_gets, "a cached file was downloaded again"


def test_split_model_downloads_every_shard(hub):
    first = resolve_hf("me/big-GGUF")
    folder = os.path.dirname(first)
    assert os.path.basename(first) == "big-Q4_K_M-00001-of-00003.gguf"
    assert sorted(f for f in os.listdir(folder) if f.startswith("big-Q4")) == sorted(
        f for f in SPLIT if f.startswith("big-Q4"))


def test_a_dropped_download_resumes_with_a_range_request(hub):
    """The connection fails after its first 10 MiB chunk (huggingface_hub's DOWNLOAD_CHUNK_SIZE: what it has
    written is what it resumes from): it asks for the rest, and the file is whole."""
    from huggingface_hub import constants

    chunk = constants.DOWNLOAD_CHUNK_SIZE
    data = bytes(range(256)) * ((chunk + chunk // 2) // 256)
    hub.repos["me/tiny-GGUF"]["tiny-Q6_K.gguf"] = data
    hub.cut_after = chunk + 1000
    path = resolve_hf("me/tiny-GGUF:Q6_K")
    assert open(path, "rb").read() == data
    assert [r[2] for r in gets(hub)] == ["", f"bytes={chunk}-"], hub.requests


def test_unknown_repo_is_named(hub):
    with pytest.raises(HubError, match="no repository 'me/nothing'"):
        resolve_hf("me/nothing")


def test_no_matching_quant_lists_the_files(hub):
    with pytest.raises(HubError, match=r"no GGUF model file named with 'IQ2_XS'.*tiny-Q4_K_M\.gguf"):
        resolve_hf("me/tiny-GGUF:IQ2_XS")


def test_unreachable_hub_uses_the_cache_or_says_so(hub, monkeypatch):
    cached = resolve_hf("me/tiny-GGUF")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # nothing listens on the discard port
    assert resolve_hf("me/tiny-GGUF") == cached
    with pytest.raises(HubError, match="cannot reach the Hub.*not in the cache"):
        resolve_hf("me/big-GGUF")


def test_offline_mode_reads_only_the_cache(hub, monkeypatch):
    cached = resolve_hf("me/tiny-GGUF")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n_requests = len(hub.requests)
    assert resolve_hf("me/tiny-GGUF") == cached
    assert len(hub.requests) == n_requests, "offline mode made a request"
    with pytest.raises(HubError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve_hf("me/big-GGUF")


def test_token_from_hf_token_reaches_a_private_repo(hub, monkeypatch):
    hub.token = "hf_secret"
    with pytest.raises(HubError, match="set HF_TOKEN"):
        resolve_hf("me/tiny-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert open(resolve_hf("me/tiny-GGUF"), "rb").read() == TINY["tiny-Q4_K_M.gguf"]


# -- LLM.from_pretrained (llama-cpp-python's signature) ------------------------------------------------------
def test_from_pretrained_glob_generates_as_the_file_does(hub, tmp_path, smol_tokens):
    llm = LLM.from_pretrained("me/smol-GGUF", "*Q4_1.gguf", local_dir=str(tmp_path / "local"), n_ctx=256,
                              n_threads=1)
    assert llm.model_path == str(tmp_path / "local" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert llm.generate("The capital of France is", 6, temperature=0).tokens == smol_tokens


def test_from_pretrained_additional_files_fetch_the_other_shards(hub, tmp_path):
    seen = []
    LLM_like = lambda path, **kw: seen.append((path, kw))   # noqa: E731 - the constructor's stand-in
    from ggflow.api.hub import from_pretrained

    from_pretrained(LLM_like, "me/big-GGUF", "*00001-of-00003.gguf",
                    additional_files=["*00002-of-00003.gguf", "*00003-of-00003.gguf"], cache_dir=str(tmp_path),
                    n_ctx=64)
    path, kwargs = seen[0]
    assert path.endswith("big-Q4_K_M-00001-of-00003.gguf") and kwargs == {"n_ctx": 64}
    assert sorted(os.listdir(os.path.dirname(path))) == sorted(f for f in SPLIT if f.startswith("big-Q4"))


@pytest.mark.parametrize("pattern, message", [("*.gguf", r"2 files \(SmolLM2"), ("*Q2_K*", "no file in me/smol")])
def test_from_pretrained_needs_exactly_one_match(hub, pattern, message):
    with pytest.raises(HubError, match=message):
        LLM.from_pretrained("me/smol-GGUF", pattern)


# -- the CLI ----------------------------------------------------------------------------------------------------
def test_run_hf_downloads_with_a_progress_bar_and_generates(hub, smol_tokens):
    argv = ["run", "-hf", "me/smol-GGUF:q4_1", "-p", "The capital of France is", "-n", "6", "--temp", "0",
            "-c", "256", "-t", "1", "--json"]
    # tqdm draws no bar on a pipe; TQDM_POSITION=-1 is huggingface_hub's switch to draw it anyway
    proc = subprocess.run([sys.executable, "-m", "ggflow.cli", *argv], capture_output=True, text=True,
                          cwd=REPO, env={**hub_env(hub.url, hub.cache), "TQDM_POSITION": "-1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["tokens"] == smol_tokens
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in proc.stderr and "%|" in proc.stderr   # tqdm's bar


@pytest.mark.parametrize("argv, message", [
    (["run", "-hf", "me/tiny-GGUF:IQ1_S"], "no GGUF model file named with 'IQ1_S'"),
    (["serve", "-hf", "me/tiny-GGUF:IQ1_S"], "no GGUF model file named with 'IQ1_S'"),
    (["serve", "-hf", "me/missing-GGUF"], "no repository 'me/missing-GGUF'"),
    (["run", "-hf", "me/tiny-GGUF", "-m", "x.gguf"], "-m/--model and -hf/--hf-repo name two models"),
    (["serve", "-hf", "tiny-GGUF"], "expected <user>/<model>[:quant]"),
])
def test_cli_hf_errors_are_one_line(hub, argv, message):
    proc = subprocess.run([sys.executable, "-m", "ggflow.cli", *argv],
                          capture_output=True, text=True, cwd=REPO, env=hub_env(hub.url, hub.cache), timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert message in proc.stderr
