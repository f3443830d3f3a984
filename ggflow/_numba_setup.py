"""How numba caches and runs its kernels, decided before numba is first imported.

numba caches a kernel next to its source (``__pycache__``); in a read-only install (a system site, a
container image) that fails, and every process would compile again. Then the cache goes to the user's
cache directory, ``$XDG_CACHE_HOME/ggflow/numba`` (``~/.cache/ggflow/numba``), unless the user chose
one with ``NUMBA_CACHE_DIR``.

numba's parallel kernels run on GNU libgomp here (its "omp" layer), whose idle threads spin after each
parallel region unless told otherwise; where other processes want the cores, that spin made ``-t 2`` ten
times slower than ``-t 1`` (docs/performance.md, "Threads"). So ggflow sets ``OMP_WAIT_POLICY=passive``
unless the user set a wait knob of their own. libgomp reads it when it is loaded, at numba's first parallel
kernel; a runtime some other library loaded earlier keeps its own setting.
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


def choose_omp_wait_policy() -> str | None:
    """Set OMP_WAIT_POLICY=passive where the user set no OpenMP wait variable; return what was set."""
    if any(os.environ.get(name) for name in OPENMP_WAIT_VARIABLES):
        return None
    os.environ["OMP_WAIT_POLICY"] = "passive"
    return "passive"


choose_cache_dir()
choose_omp_wait_policy()
