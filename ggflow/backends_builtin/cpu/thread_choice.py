"""Whether a parallel kernel pays now: a choice made per call from what recent calls of that size took.

Two threads pay only while the second core is free. On a machine whose cores other processes want, a
parallel region waits for a scheduler slice at its start or its end (docs/performance.md, "Threads"),
and then the same product on the calling thread alone is faster: ``-t 2`` was slower than ``-t 1``.
So each product size (a weight's shape times a token count, on a thread count) keeps the smoothed time
of its recent parallel and serial calls, runs the faster way, and every PROBE_EVERY calls tries the
other, which follows the load as it changes. Results do not depend on the choice: every kernel computes
each output row the same way on any thread.
"""
from __future__ import annotations

import time
from typing import Callable, Hashable

PROBE_EVERY = 16      # one call in this many runs the other way: ~3% of a product's time when it loses
SMOOTHING = 0.25      # weight of the newest call in the running time: a preempted call fades in a few


class ThreadChoice:
    """The running times of one product size, serial ([0]) and parallel ([1])."""

    __slots__ = ("seconds", "seen", "calls")

    def __init__(self) -> None:
        self.seconds: list[float | None] = [None, None]
        self.seen = [0, 0]
        self.calls = 0

    def parallel_now(self) -> bool:
        self.calls += 1
        serial, parallel = self.seconds
        if parallel is None:
            return True
        if serial is None:
            return False
        faster = parallel <= serial
        return faster != (self.calls % PROBE_EVERY == 0)

    def record(self, parallel: bool, seconds: float) -> None:
        self.seen[parallel] += 1
        if self.seen[parallel] == 1:
            return   # a kernel's first call may include loading it from numba's cache
        old = self.seconds[parallel]
        self.seconds[parallel] = seconds if old is None else old + SMOOTHING * (seconds - old)


_choices: dict[Hashable, ThreadChoice] = {}


def choice_for(key: Hashable) -> ThreadChoice:
    """The one ThreadChoice of a product size, shared by every plan that runs it."""
    choice = _choices.get(key)
    if choice is None:
        choice = _choices[key] = ThreadChoice()
    return choice


def adaptive(key: Hashable, parallel: Callable[[], None], serial: Callable[[], None]) -> Callable[[], None]:
    """A call that runs ``parallel`` or ``serial`` (the same product), whichever the key's recent calls
    found faster."""
    choice = choice_for(key)
    clock = time.perf_counter

    def run() -> None:
        use_parallel = choice.parallel_now()
        start = clock()
        (parallel if use_parallel else serial)()
        choice.record(use_parallel, clock() - start)
    return run
