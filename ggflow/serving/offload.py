"""Work too heavy for the asyncio event loop (parsing a large JSON body, tokenizing, rendering a chat
template, compiling a grammar, building sampler chains) runs in a small, bounded pool of worker threads, so
one client's 1 MiB request does not stall the streams of all the others for the time it takes.

The pool's threads share the GIL with the loop: Python switches between them every few milliseconds, so a
streaming bystander waits milliseconds, not the whole of another request's parsing.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

OFFLOAD_WORKERS = 2            # bounded: more threads would only contend for the same GIL and cores
SMALL_BODY_BYTES = 16 << 10    # a body below this is parsed on the loop (a thread hop costs more than it)

_T = TypeVar("_T")
_pool = ThreadPoolExecutor(max_workers=OFFLOAD_WORKERS, thread_name_prefix="ggflow-offload")


async def off_loop(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` in the worker pool; its exception is raised here, in the handler."""
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args, **kwargs))
