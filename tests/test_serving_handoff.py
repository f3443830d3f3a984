"""The engine-to-event-loop handoff: events in order, one wake-up of the loop for all posted together."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ggflow.serving.handoff import Mailbox


def test_events_posted_together_take_one_wake_up_and_keep_their_order():
    async def main():
        box = Mailbox.of_running_loop()
        assert Mailbox.of_running_loop() is box          # one per loop
        wakes = []
        real = box.loop.call_soon_threadsafe
        box.loop.call_soon_threadsafe = lambda fn, *a: (wakes.append(fn), real(fn, *a))[1]
        a, b = asyncio.Queue(), asyncio.Queue()
        # another thread posts while this loop is busy (it waits for the thread without yielding)
        poster = threading.Thread(target=lambda: [box.post(q, i) for i, q in enumerate([a, b, a, b, a])])
        poster.start()
        poster.join()
        await asyncio.sleep(0)
        assert len(wakes) == 1
        assert [a.get_nowait() for _ in range(3)] == [0, 2, 4] and [b.get_nowait() for _ in range(2)] == [1, 3]
        box.post(a, "later")                             # the next batch asks for its own wake-up
        assert await asyncio.wait_for(a.get(), 5) == "later" and len(wakes) == 2
    asyncio.run(main())


def test_posting_to_a_closed_loop_raises_and_keeps_nothing():
    loop = asyncio.new_event_loop()
    box = Mailbox(loop)
    loop.close()
    with pytest.raises(RuntimeError):
        box.post(asyncio.Queue(), "x")
    with pytest.raises(RuntimeError):      # not silently swallowed as "a wake-up is already on its way"
        box.post(asyncio.Queue(), "y")
