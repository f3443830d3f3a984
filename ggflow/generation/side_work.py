"""Work the engine thread does besides generating (embeddings, rerank scores), a bounded piece per step.

A job that evaluates 30 inputs of 4,000 tokens must not hold the engine for its whole length: every
generating stream would stall until it is done. A ``SideJob`` is therefore run in pieces of at most the
tokens the step budget leaves (step_budget.py), one piece per engine step after the slots' decode, so the
generating slots go on between pieces. Jobs take turns (round robin), so a small embedding request is not
queued behind a large one. A job's result (or its error) is set on its Future when its last piece is done.
"""
from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import Future
from typing import Any

from ggflow.generation.request import QueueFullError

log = logging.getLogger(__name__)


class SideJob:
    """A piece-wise job. Subclasses evaluate at most ``n_tokens`` tokens per ``run_piece`` call."""

    def __init__(self) -> None:
        self.future: Future = Future()

    @property
    def done(self) -> bool:
        return self.future.done()

    def run_piece(self, n_tokens: int, n_free_cells: int) -> int:
        """Do a piece of at most ``n_tokens`` tokens using at most ``n_free_cells`` more KV cells; set the
        future when finished. Returns the tokens evaluated."""
        raise NotImplementedError

    def cells_held(self) -> int:
        """KV cells the job holds between pieces (released by ``abandon``)."""
        return 0

    def release_cells(self) -> int:
        """Give back the KV cells held (the generating slots need them); the job may go on later. The cells
        freed."""
        n = self.cells_held()
        if n:
            self.abandon(QueueFullError("the KV cache is needed by the generating slots: retry later"))
        return n

    def abandon(self, exc: BaseException) -> None:
        """Release what the job holds and end it with ``exc``."""
        if not self.future.done():
            self.future.set_exception(exc)


class SideWork:
    """The queue of side jobs; ``submit`` from any thread, ``run`` in the engine thread."""

    def __init__(self) -> None:
        self._jobs: collections.deque[SideJob] = collections.deque()
        self._lock = threading.Lock()

    def submit(self, job: SideJob) -> Future:
        with self._lock:
            self._jobs.append(job)
        return job.future

    @property
    def pending(self) -> bool:
        return bool(self._jobs)

    def run(self, n_tokens: int, n_free_cells: int) -> int:
        """One piece of the next job in turn (cancelled ones are dropped); the tokens it evaluated."""
        while self._jobs:
            with self._lock:
                job = self._jobs.popleft()
            if job.future.cancelled():
                job.abandon(RuntimeError("cancelled"))
                continue
            try:
                n = job.run_piece(max(n_tokens, 1), n_free_cells)
            except Exception as exc:   # the job's own failure ends that job, not the engine
                log.info("side job failed: %s: %s", type(exc).__name__, exc)
                job.abandon(exc)
                return 0
            if not job.done:
                with self._lock:
                    self._jobs.append(job)
            return n
        return 0

    def jobs(self) -> list[SideJob]:
        """The jobs waiting for their next piece (not the one running)."""
        return list(self._jobs)

    def release_cells(self) -> int:
        """The generating slots need KV cells: every job gives back those it holds; the cells freed."""
        freed = sum(job.release_cells() for job in list(self._jobs))
        with self._lock:
            self._jobs = collections.deque(j for j in self._jobs if not j.done)
        return freed

    def abandon_all(self, exc: BaseException) -> None:
        with self._lock:
            jobs, self._jobs = list(self._jobs), collections.deque()
        for job in jobs:
            job.abandon(exc)
