"""LLVM's clean pages given back (backends_builtin/cpu/jit_pages.py): which mappings qualify, that they leave
this process's RSS, and that numba still compiles and runs kernels after (their code faults back in)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ggflow.backends_builtin.cpu import jit_pages

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fd:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
7f0000100000-7f0005000000 r-xp 00100000 fd:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:               52136 kB
Anonymous:             0 kB
7f0005000000-7f0005200000 r--p 05000000 fd:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:                1792 kB
Anonymous:          1792 kB
7f0005200000-7f0005300000 rw-p 05200000 fd:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:                 156 kB
Anonymous:             0 kB
7f0006000000-7f0007000000 r-xp 00000000 fd:01 43 /usr/lib/x86_64-linux-gnu/libLLVM-15.so.1
Rss:               40000 kB
Anonymous:             0 kB
7f0008000000-7f0008100000 r-xp 00000000 fd:01 44 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1000 kB
Anonymous:             0 kB
7f0009000000-7f0009100000 rw-p 00000000 00:00 0
Rss:                1000 kB
Anonymous:          1000 kB
"""


def test_only_llvmlites_mappings_without_private_pages_qualify():
    assert jit_pages.clean_mappings(SMAPS) == [
        (0x7f0000000000, 0x7f0000100000),     # headers, symbols: the file's pages
        (0x7f0000100000, 0x7f0005000000),     # code
    ]   # not the relocated tables (private copies), the writable data, Mesa's LLVM, libc, anonymous memory


BODY = """
import numpy as np
from numba import njit
from ggflow.backends_builtin.cpu import jit_pages

def llvm_resident_kib():
    total, llvm = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and len(fields[1]) == 4:
            llvm = len(fields) == 6 and fields[5].endswith("/" + jit_pages.LIBRARY)
        elif llvm and fields[0] == "Rss:":
            total += int(fields[1])
    return total

jit_pages.start_jit()
before = llvm_resident_kib()
advised = jit_pages.release_code_pages()
after = llvm_resident_kib()

@njit
def dot(a, b):                 # compiled after the release: LLVM's whole pipeline runs again
    s = 0.0
    for i in range(a.size):
        s += a[i] * b[i]
    return s

x = np.arange(100, dtype=np.float64)
print(before, advised >> 10, after, dot(x, x) == float(x @ x))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (Linux only)")
def test_release_drops_llvms_pages_and_numba_still_compiles(tmp_path):
    done = subprocess.run([sys.executable, "-c", BODY], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    before, advised, after, compiled = done.stdout.split()
    assert int(before) > 20_000                  # the JIT's start left tens of MiB of LLVM mapped
    assert int(advised) >= int(before) // 2
    assert int(after) < int(before) // 4         # what stays: the relocated tables, the writable data
    assert compiled == "True"
