"""How many threads a plan should use now: the cores the process may run on, less those other processes keep busy.

Two threads pay only while the second core is free for them. A parallel region's threads meet at its end,
so a worker that shares its core with another process makes the whole region wait for a scheduler slice
(docs/performance.md, "Threads": ``-t 2`` fell from 84 to 71 tok/s against ``-t 1`` with the other core
busy). And the cheap way to start regions, worker threads that spin for a while after each one instead of
sleeping (a halted virtual CPU takes ~60 us to wake: more than a decode step's products take), is exactly
what hurts a busy neighbour. So the CPU backend spins (``ggflow/_numba_setup.py``) and this module takes
the threads back when others want the cores: every ``INTERVAL`` seconds it reads, from ``/proc/stat``, how
busy the process's CPUs were, subtracts the process's own CPU time (spinning workers included), and lets a
plan use one thread per core that the others left free (at least one, at most what the plan asked for).

Numerics do not depend on it: every kernel computes each output row the same way on any thread count.
Where ``/proc/stat`` cannot be read (not Linux), or ``GGFLOW_FOLLOW_LOAD=0`` is set, a plan keeps the threads
it asked for.
"""
from __future__ import annotations

import os
import time
from collections import Counter

INTERVAL = 0.1          # seconds between two readings: /proc/stat counts in 10 ms ticks
BUSY_FRACTION = 0.25    # a core that others used more than this fraction of the time is theirs
PROC_STAT = "/proc/stat"
ENABLED = os.environ.get("GGFLOW_FOLLOW_LOAD", "1") != "0"


def cpu_seconds(stat_text: str, cpus: frozenset[int], tick: float) -> tuple[float, float]:
    """(busy, total) seconds summed over ``cpus`` from the text of /proc/stat: busy is everything but idle
    and iowait (steal included: a virtual CPU the hypervisor ran elsewhere was not ours either)."""
    busy = total = 0
    for line in stat_text.splitlines():
        if not line.startswith("cpu") or line[3:4] == " ":
            continue
        name, *fields = line.split()
        if int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]         # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy * tick, total * tick


class SpareCores:
    """The number of cores other processes left free over the last reading, refreshed at most every INTERVAL."""

    def __init__(self, read_stat=None, own_cpu_seconds=None, clock=time.monotonic,
                 cpus: frozenset[int] | None = None):
        self.cpus = _allowed_cpus() if cpus is None else cpus
        self._read_stat = read_stat or _read_proc_stat
        self._own = own_cpu_seconds or _own_cpu_seconds
        self._clock = clock
        self._tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self.free = len(self.cpus)
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        text = self._read_stat()
        if text is None:
            return None
        busy, _ = cpu_seconds(text, self.cpus, self._tick)
        return self._clock(), busy, self._own()

    def threads(self, wanted: int) -> int:
        """How many of ``wanted`` threads to use now."""
        if self._last is None:
            return wanted
        if self._clock() - self._last[0] >= INTERVAL:
            self._update()
        return max(1, min(wanted, self.free))

    def _update(self) -> None:
        now = self._sample()
        if now is None:
            self._last = None
            return
        wall = now[0] - self._last[0]
        others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2])) / wall   # cores' worth
        self.free = len(self.cpus) - int(others + 1 - BUSY_FRACTION)
        self._last = now


def _allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask where the system has one: Linux)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def _read_proc_stat() -> str | None:
    try:
        with open(PROC_STAT) as f:
            return f.read()
    except OSError:
        return None


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


_shared: SpareCores | None = None
in_use = 0      # the threads of the plan running now (0: none); kernels that choose a way read it
plans_by_threads: Counter = Counter()   # plan runs per thread count used, for reports (ggflow bench)


def threads_now(wanted: int) -> int:
    """``wanted`` less the cores other processes keep busy (one SpareCores per process, made on first use);
    also what ``in_use`` says until the next call."""
    global _shared, in_use
    if ENABLED and wanted > 1:
        if _shared is None:
            _shared = SpareCores()
        wanted = _shared.threads(wanted)
    in_use = wanted
    plans_by_threads[wanted] += 1
    return wanted
