"""One caller at a time: an LLM has one KV cache and one token history, so calls from several threads take
turns, each whole (a streamed generation holds its turn from its first piece until it ends or is closed).

A thread that starts a new call while its own earlier stream is still open ends that stream first (it
could not continue anyway: the cache no longer holds its tokens). A call made from inside a running
generation (a logits processor calling back into the LLM) is refused rather than deadlocked.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ggflow.errors import GGFlowError


class CallerLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None     # thread holding the turn
        self._stream: Any = None           # the open stream holding it, if any (has close())

    @contextmanager
    def turn(self, stream: Any = None) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me and self._stream is not None and self._stream is not stream:
            try:
                self._stream.close()       # this thread's earlier, unfinished stream
            except ValueError:             # "generator already executing": we are inside it
                pass
        if self._owner == me:
            raise GGFlowError("this LLM was called from inside one of its own running calls (e.g. from a "
                              "logits processor or a stopping criterion); call it after that one returns")
        self._lock.acquire()
        self._owner, self._stream = me, stream
        try:
            yield
        finally:
            self._owner = self._stream = None
            self._lock.release()
