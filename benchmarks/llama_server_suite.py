#!/usr/bin/env python3
"""Run llama.cpp's own server test suite (tools/server/tests of the llama-cpp-python 0.3.36 sdist) against
``ggflow serve``, and print a per-file table of passed / failed / errors / skipped.

Nothing of llama.cpp is in the project: the tests are unpacked at run time from the sdist (``--sdist``, or
``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`` into ``--work``) into ``--work``. The
tests start the binary named by LLAMA_SERVER_BIN_PATH with llama-server's flags; here that is
benchmarks/llama_server_shim.py (or ``--server BIN`` for the real llama-server, for the comparison column).
Two run-time files go next to the unpacked tests, never into the project: a conftest that skips the session's
hub downloads (every preset is mapped to a local file by the shim, or refused with why), and a ``wget`` stand-in
for the few tests that download extra files (they fail, naming the URL: the suite runs offline).

    python benchmarks/llama_server_suite.py                     # the default files
    python benchmarks/llama_server_suite.py test_tokenize.py -k "not slow" --file-timeout 900
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}"
LLAMA_IN_SDIST = f"{SDIST}/vendor/llama.cpp/"
# the tests, and the chat templates they name as ../../../models/templates/X.jinja from the tests' folder
UNPACKED = ("tools/server/tests/", "models/templates/")
REPO = Path(__file__).resolve().parent.parent
SHIM = Path(__file__).resolve().parent / "llama_server_shim.py"
DEFAULT_SDISTS = (Path("/work/llama-src") / f"{SDIST}.tar.gz",)

# the files whose models the shim maps (stories260K -> the default model); the rest need models or features
# ggflow cannot get offline (see docs/serving.md)
DEFAULT_FILES = ("test_basic.py", "test_tokenize.py", "test_completion.py", "test_chat_completion.py",
                 "test_template.py", "test_slot_save.py", "test_infill.py", "test_compat_anthropic.py",
                 "test_compat_oai_responses.py", "test_ctx_shift.py", "test_ignore_eos.py", "test_stream.py",
                 "test_security.py", "test_metrics.py", "test_tool_call.py")

NO_DOWNLOADS_CONFTEST = '''\
# written by ggflow's benchmarks/llama_server_suite.py: the models are local, nothing is downloaded
import pytest


@pytest.fixture(scope="session", autouse=True)
def load_server_presets(configure_worker_port):
    yield
'''

WGET_STANDIN = '''\
# written by ggflow's benchmarks/llama_server_suite.py: the suite runs offline
def download(url, out=None, bar=None):
    raise RuntimeError(f"offline run: {url} is not downloaded (the test needs a file from the hub)")
'''


def sdist_path(given: str | None, work: Path) -> Path:
    if given:
        return Path(given)
    for p in (*DEFAULT_SDISTS, work / f"{SDIST}.tar.gz"):
        if p.is_file():
            return p
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(work)], check=True)
    return work / f"{SDIST}.tar.gz"


def unpack_tests(sdist: Path, work: Path) -> Path:
    """tools/server/tests and models/templates from the sdist into ``work``/llama.cpp (only those files, with
    no path leaving ``work``); the tests' folder."""
    root = work / "llama.cpp"
    dest = root / "tools" / "server" / "tests"
    if not (dest / "unit").is_dir() or not (root / "models" / "templates").is_dir():
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and any(
                m.name.startswith(LLAMA_IN_SDIST + part) for part in UNPACKED)]
            for m in members:
                m.name = m.name[len(LLAMA_IN_SDIST):]
                if not m.name or m.name.startswith("/") or ".." in Path(m.name).parts:
                    raise SystemExit(f"refusing sdist member {m.name!r}")
            tar.extractall(root, members=members, filter="data")
    (dest / "unit" / "conftest.py").write_text(NO_DOWNLOADS_CONFTEST)
    (dest / "wget.py").write_text(WGET_STANDIN)
    (dest / "tmp").mkdir(exist_ok=True)
    return dest


def run_file(tests: Path, name: str, server: str, extra: list[str], timeout: float, log_dir: Path) -> dict:
    """One test file in its own pytest; counts from its junit report (a timeout counts what it got to)."""
    report = log_dir / f"{name}.xml"
    report.unlink(missing_ok=True)
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": server, "PYTHONPATH": os.pathsep.join(
        [str(tests), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
           f"unit/{name}", *extra]
    with open(log_dir / f"{name}.log", "w") as log:
        try:
            subprocess.run(cmd, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "timed_out": timed_out}
    if report.is_file():
        for case in ET.parse(report).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            key = ("failed" if "failure" in kinds else "errors" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
            counts[key] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help=f"test files under unit/ (default: {' '.join(DEFAULT_FILES)})")
    ap.add_argument("--sdist", help=f"the llama-cpp-python {VERSION} sdist (default: found or pip-downloaded)")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/ggflow/llama-server-suite"),
                    help="where the tests are unpacked and the logs go")
    ap.add_argument("--server", default=str(SHIM), help="the server binary (default: the ggflow shim)")
    ap.add_argument("--file-timeout", type=float, default=1800, help="seconds per test file")
    ap.add_argument("-k", dest="keyword", help="pytest's -k")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tests = unpack_tests(sdist_path(args.sdist, work), work)
    log_dir = work / "logs"
    log_dir.mkdir(exist_ok=True)
    extra = ["-k", args.keyword] if args.keyword else []
    rows = []
    print(f"{'file':32} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7}  total", flush=True)
    for name in args.files or DEFAULT_FILES:
        c = run_file(tests, name, args.server, extra, args.file_timeout, log_dir)
        total = c["passed"] + c["failed"] + c["errors"] + c["skipped"]
        rows.append((name, c, total))
        print(f"{name:32} {c['passed']:6} {c['failed']:6} {c['errors']:6} {c['skipped']:7}  {total}"
              + ("  (timed out)" if c["timed_out"] else ""), flush=True)
    print(f"logs and junit reports: {log_dir}")
    if args.markdown:
        print("\n| file | passed / total (skipped) |\n|---|---|")
        for name, c, total in rows:
            print(f"| {name} | {c['passed']} / {total}" + (f" ({c['skipped']})" if c["skipped"] else "")
                  + (" (timed out)" if c["timed_out"] else "") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
