"""A plan's numba kernels called through their compiled entry points, not through their dispatchers.

A call of an ``njit`` function goes through its dispatcher, which types every argument to find the
compiled version that takes them: 0.25 us of a 0.53 us call with four arrays, 0.26 of 0.55 with fourteen
arguments (docs/performance.md, "Per-step overhead"). A compiled plan calls each kernel with the same
arrays at every run, so the types are known when the plan is bound: ``bind`` looks the compiled version up
once (compiling it, or loading it from numba's cache, as the first call would have) and the plan calls it
directly, as the quantized products' drivers have long been called (``qmm.template.entry_point``).

The entry point converts its arguments by the types it was compiled for and checks nothing else, so it
is only ever called with the arguments it was looked up for (``bind`` holds them), or with arrays of the
same dtype, rank and layout (``lookup``'s callers say which).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numba
from numba.core.dispatcher import Dispatcher


def lookup(kernel, *args) -> Callable[..., Any]:
    """The compiled version of the njit function ``kernel`` for arguments of the types of ``args``."""
    return kernel.compile(tuple(numba.typeof(a) for a in args))


def bind(kernel, *args) -> Callable[[], Any]:
    """``kernel(*args)`` as a call of its compiled version, with these very arguments at every call (a kernel
    that is not an njit function, a test's stand-in say, as it is)."""
    return partial(lookup(kernel, *args) if isinstance(kernel, Dispatcher) else kernel, *args)


def bind_lazily(kernel, *args) -> Callable[[], Any]:
    """``bind`` on the first call: for a kernel a plan may never run (a parallel driver a one-thread run
    never takes), whose compile or cache load a plan should not pay up front."""
    bound: list[Callable[[], Any]] = []

    def call() -> Any:
        if not bound:
            bound.append(bind(kernel, *args))
        return bound[0]()
    return call
