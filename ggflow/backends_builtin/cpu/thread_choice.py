"""Whether a parallel kernel pays now: a choice made per call from what recent calls of that size took.

Two threads pay only while the second core is free. On a machine whose cores other processes want, a
parallel region waits for a scheduler slice at its start or its end (docs/performance.md, "Threads"),
and then the same product on the calling thread alone is faster: ``-t 2`` was slower than ``-t 1``.
So each product size (a weight's shape times a token count, on a thread count) keeps the smoothed time
of its recent calls of the way in use, runs that way, and now and then tries the other (a probe). A probe
that loses doubles the calls until the next one (FIRST_PROBE_AFTER up to LAST_PROBE_AFTER), since a losing
parallel probe on a busy machine costs a whole scheduler slice; one slow call among fast ones (OUTLIER) is
not taken for a change of load; and when the way in use has become slower than the other's last known time,
the other is probed at once.

The way changes only through a probe that beats the way in use now: both its smoothed time and its last
call, the one right before the probe. A shared host's memory rate moves within seconds, and a one-token
product's time moves with it, so a probe is compared with the call beside it rather than with an average
gathered in other conditions (docs/performance.md, "Threads").
Results do not depend on the choice: every kernel computes each output row the same way on any thread.
"""
from __future__ import annotations

import time
from typing import Callable, Hashable

from ggflow.backends_builtin.cpu import spare_cores

FIRST_PROBE_AFTER = 16    # calls the faster way between two tries of the other, after a change of way
LAST_PROBE_AFTER = 256    # ... growing to this while the tries keep losing
SMOOTHING = 0.25          # weight of the newest call in a way's running time: a preempted call fades in a few
# A call counts at most this many times its way's running time: one preempted call (a parallel region whose
# worker lost its core for a slice: 2-10x its usual time) then moves the running time by at most a quarter,
# and the choice turns only when two or more in a row are slow, as a busy neighbour makes them. Counted whole,
# one such call turned a TinyLlama decode's products to serial for 16 calls at a time: 14% of its gate and up
# products ran serially at -t 2 (360 against 251 us) on a host whose other tenants come and go.
OUTLIER = 2.0


class ThreadChoice:
    """The running times of one product size, serial ([0]) and parallel ([1]), and the way in use."""

    __slots__ = ("seconds", "seen", "until_probe", "probe_after", "faster", "last")

    def __init__(self) -> None:
        self.seconds: list[float | None] = [None, None]
        self.seen = [0, 0]
        self.until_probe = self.probe_after = FIRST_PROBE_AFTER
        self.faster = True                  # the way in use: True for parallel
        self.last: float | None = None      # the time of the last call of the way in use

    def parallel_now(self) -> bool:
        if None in self.seconds:
            return self.seconds[1] is None   # parallel first, then serial, two calls each
        self.until_probe -= 1
        if self.until_probe > 0:
            return self.faster
        self.until_probe = self.probe_after
        return not self.faster

    def record(self, parallel: bool, seconds: float) -> None:
        self.seen[parallel] += 1
        if self.seen[parallel] == 1:
            return   # a kernel's first call may include loading it from numba's cache
        old = self.seconds[parallel]
        if None in self.seconds:            # still measuring both ways: the faster is the way in use
            self.seconds[parallel] = seconds if old is None else _smoothed(old, seconds)
            if None not in self.seconds:
                self.faster = self.seconds[1] <= self.seconds[0]
                self.last = self.seconds[self.faster]
            return
        if parallel == self.faster:
            self.seconds[parallel] = _smoothed(old, seconds)
            self.last = seconds
            if self.seconds[parallel] > self.seconds[not parallel]:
                self.until_probe = 0        # slower than the other way was: try it now
            return
        if seconds < min(self.seconds[self.faster], self.last):     # a probe that beats the way in use now
            self.faster, self.last = parallel, seconds
            self.seconds[parallel] = seconds
            self.probe_after = FIRST_PROBE_AFTER
        else:                               # it lost: no faster than the way in use, so not counted as faster
            self.seconds[parallel] = max(seconds, self.seconds[self.faster])
            self.probe_after = min(2 * self.probe_after, LAST_PROBE_AFTER)
        self.until_probe = self.probe_after


def _smoothed(running: float, seconds: float) -> float:
    """A way's running time after a call of it that took ``seconds`` (counted at most OUTLIER times the running)."""
    return running + SMOOTHING * (min(seconds, OUTLIER * running) - running)


_choices: dict[Hashable, ThreadChoice] = {}


def choice_for(key: Hashable) -> ThreadChoice:
    """The one ThreadChoice of a product size, shared by every plan that runs it."""
    choice = _choices.get(key)
    if choice is None:
        choice = _choices[key] = ThreadChoice()
    return choice


def adaptive(key: Hashable, parallel: Callable[..., None], serial: Callable[..., None]) -> Callable[..., None]:
    """A function that calls ``parallel`` or ``serial`` (the same product, the same arguments), whichever
    the key's recent calls found faster."""
    choice = choice_for(key)
    clock = time.perf_counter

    def run(*args) -> None:
        if spare_cores.in_use == 1:      # the plan runs on one thread now: a parallel region would be one too
            serial(*args)
            return
        use_parallel = choice.parallel_now()
        start = clock()
        (parallel if use_parallel else serial)(*args)
        choice.record(use_parallel, clock() - start)
    return run
