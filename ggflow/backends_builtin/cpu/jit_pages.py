"""LLVM's pages, given back once numba's JIT has done its work.

numba links LLVM into the process (llvmlite's ``libllvmlite.so``, 170 MiB). Importing numba and starting its
JIT (the CPU target; the runtime's helpers, compiled from IR through LLVM's whole pipeline) run code from all
over the library, and ~68 MiB of its pages stay mapped: on SmolLM2 that is most of what separates ggflow's
peak RSS from llama.cpp's (docs/performance.md, "Memory"). A process whose kernels come from numba's cache runs
little of that code again: loading a cached kernel (the object-file linker) faults back ~10 MiB.

The pages given back are those of the library's mappings that hold no private copy of a page (its code and
read-only data; /proc/self/smaps says which, read once): each is the file's page in the page cache, and
``madvise(MADV_DONTNEED)`` only unmaps it from this process. The page cache keeps it (for this process and
others) and the next use maps it again, the same bytes. A mapping with private copies (the tables relocated
at load, the writable data) is left alone: dropping those would lose what was written. Linux only; elsewhere,
and wherever /proc or madvise is missing, nothing happens.

The CPU backend starts the JIT and gives the pages back before it packs a model's weights (so the peak does
not hold them beside the packed copies), again after packing (the packers' kernels loaded), and after each
plan's first run (its kernels load then).
"""
from __future__ import annotations

import ctypes
import mmap
import os

from numba import njit

# llvmlite's build of LLVM, which numba's JIT runs. Loaded once (ctypes, never closed) for the process's
# life, so its mappings stay where they were found. Other copies of LLVM are left alone: Mesa's drivers
# load libLLVM-<n>.so (lavapipe, when ggflow probes for Vulkan: 42 MiB resident) and may unload it with
# the Vulkan instance, after which its addresses could hold other memory that dropping pages would zero.
LIBRARY = "libllvmlite.so"
MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)   # Linux's; elsewhere nothing is given back


@njit(cache=True)
def _first_kernel() -> int:
    return 0


def start_jit() -> None:
    """Start numba's JIT now (a cached kernel's first call does it), so that what it faults in can be given back
    before the weights are packed rather than stay on top of them."""
    _first_kernel()


def clean_mappings(smaps_text: str, library: str = LIBRARY) -> list[tuple[int, int]]:
    """(start, end) of each mapping of the file named ``library`` in /proc/<pid>/smaps text that is not writable
    and holds no private copy of a page (``Anonymous: 0 kB``): every page of it is the file's. That is the code and the
    read-only data; the relocated tables (RELRO: read-only now, but written when the library was loaded) hold
    private copies and are not listed."""
    ranges, current = [], None
    for line in smaps_text.splitlines():
        fields = line.split(maxsplit=5)
        if fields and "-" in fields[0] and len(fields) >= 5 and len(fields[1]) == 4:   # a mapping's header
            current = None
            if len(fields) == 6 and "w" not in fields[1] and os.path.basename(fields[5]) == library:
                current = tuple(int(v, 16) for v in fields[0].split("-"))
        elif current is not None and fields[:1] == ["Anonymous:"]:
            if fields[1] == "0":
                ranges.append(current)
            current = None
    return ranges


def _madvise():
    fn = getattr(ctypes.CDLL(None, use_errno=True), "madvise", None)   # the process's own symbols: libc's
    if fn is not None:
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = ctypes.c_int
    return fn


_RANGES: list[tuple[int, int]] | None = None   # found once: a loaded library's mappings stay where they are
_MADVISE = None


def release_code_pages() -> int:
    """Unmap LLVM's clean pages from this process (they stay in the page cache); return the bytes advised
    (0 where the library is not mapped or the system has no /proc or madvise)."""
    global _RANGES, _MADVISE
    if _RANGES is None:
        try:
            with open("/proc/self/smaps") as f:
                _RANGES = clean_mappings(f.read())
        except OSError:
            _RANGES = []
        _MADVISE = (_madvise() or False) if _RANGES and MADV_DONTNEED is not None else False
    if not _MADVISE:
        return 0
    advised = 0
    for start, end in _RANGES:
        if _MADVISE(start, end - start, MADV_DONTNEED) == 0:
            advised += end - start
    return advised
