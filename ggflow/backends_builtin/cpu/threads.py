"""When a numba kernel runs its rows in parallel.

Starting a parallel region wakes the other threads and waits for all of them at its end: some 10-20 us
on an idle machine, and a whole scheduler time slice (milliseconds) when the cores are busy with other
work. A decode step's rms_norm or rope (one token) is far smaller than that, so kernels come in a
parallel and a serial driver over the same row function, and small tensors take the serial one.
"""
from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

PARALLEL_MIN_ELEMENTS = 1 << 16


def driver_for(n_elements: int, parallel: F, serial: F) -> F:
    return parallel if n_elements >= PARALLEL_MIN_ELEMENTS else serial
