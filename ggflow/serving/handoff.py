"""Events from the engine thread into an asyncio event loop, one wake-up for all that arrive together.

Each ``loop.call_soon_threadsafe`` writes to the loop's self-pipe and costs the loop a wake-up; with four
slots that was four per step. A loop's ``Mailbox`` collects (queue, event) pairs and asks for one wake-up
when the first arrives; what the engine posts before the loop runs (the other slots' tokens of the same
step) rides along. Events of one request keep their order: one engine thread posts them, one list holds them.
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

_mailboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox]" = weakref.WeakKeyDictionary()


class Mailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._posted: list[tuple[asyncio.Queue, Any]] = []

    @classmethod
    def of_running_loop(cls) -> "Mailbox":
        """The running loop's mailbox (call it in the loop's thread)."""
        loop = asyncio.get_running_loop()
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = cls(loop)
        return box

    def post(self, queue: asyncio.Queue, event: Any) -> None:
        """From any thread: put ``event`` on ``queue`` in the loop. Raises RuntimeError if the loop is closed."""
        with self._lock:
            self._posted.append((queue, event))
            if len(self._posted) > 1:
                return                         # a wake-up is on its way and will take this one too
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:                   # the loop is closed: nothing will ever read these
            with self._lock:
                self._posted.clear()
            raise

    def _deliver(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
        for queue, event in posted:
            queue.put_nowait(event)
