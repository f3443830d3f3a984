"""Where numba keeps its compiled kernels, decided before numba is first imported.

numba caches a kernel next to its source (``__pycache__``); in a read-only install (a system site, a
container image) that fails, and every process would compile again. Then the cache goes to the user's
cache directory, ``$XDG_CACHE_HOME/ggflow/numba`` (``~/.cache/ggflow/numba``), unless the user chose
one with ``NUMBA_CACHE_DIR``.
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


choose_cache_dir()
