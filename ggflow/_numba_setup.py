"""How numba caches and runs its kernels, decided before numba is first imported.

numba caches a kernel next to its source (``__pycache__``); in a read-only install (a system site, a
container image) that fails, and every process would compile again. Then the cache goes to the user's
cache directory, ``$XDG_CACHE_HOME/ggflow/numba`` (``~/.cache/ggflow/numba``), unless the user chose
one with ``NUMBA_CACHE_DIR``.

numba's parallel kernels run on GNU libgomp here (its "omp" layer). How its idle threads wait decides what
a parallel region costs: a thread that sleeps must be woken (on a virtual machine whose idle vCPU halted,
~60 us: more than a decode step's matrix products take), while one that spins starts at once but holds a
core that another process may want. ggflow spins for a bounded while (``GOMP_SPINCOUNT=100000``, a few
milliseconds, long enough to span the gaps between a step's regions and between decode steps) and, since
spinning threads hurt where other processes want the cores (``-t 2`` was ten times slower than ``-t 1``
with libgomp's longer default spin: docs/performance.md, "Threads"), the CPU backend gives threads back
when other processes keep cores busy (``backends_builtin/cpu/spare_cores.py``). A wait knob of the user's
own (OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME) is left alone. libgomp reads it when it is loaded, at
numba's first parallel kernel; a runtime some other library loaded earlier keeps its own setting.
"""
from __future__ import annotations

import os
import sys

KERNELS_DIR = os.path.join(os.path.dirname(__file__), "backends_builtin", "cpu")


def user_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ggflow", "numba")


def in_tree_cache_writable(kernels_dir: str = KERNELS_DIR) -> bool:
    pycache = os.path.join(kernels_dir, "__pycache__")
    return os.access(pycache if os.path.isdir(pycache) else kernels_dir, os.W_OK)


def choose_cache_dir() -> str | None:
    """Set NUMBA_CACHE_DIR where the user did not and the package cannot hold the cache; return what was set."""
    if os.environ.get("NUMBA_CACHE_DIR") or in_tree_cache_writable():
        return None
    path = user_cache_dir()
    os.environ["NUMBA_CACHE_DIR"] = path
    if "numba" in sys.modules:  # imported before ggflow: its config has read the environment already
        sys.modules["numba"].config.CACHE_DIR = path
    return path


# Any of these set means the user chose how OpenMP threads wait (libgomp's, Intel's / LLVM's runtime).
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


SPIN_COUNT = "100000"   # libgomp's spins (a pause instruction each, 20-70 ns) before an idle thread sleeps


def choose_omp_wait_policy() -> str | None:
    """Set GOMP_SPINCOUNT=SPIN_COUNT where the user set no OpenMP wait variable; return what was set."""
    if any(os.environ.get(name) for name in OPENMP_WAIT_VARIABLES):
        return None
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return SPIN_COUNT


choose_cache_dir()
choose_omp_wait_policy()
