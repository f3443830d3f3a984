"""What a generation returns: its Completion (text, tokens, why it ended, timings) or, streamed, a Generation."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ggflow.generation.logprobs import TokenLogprob

FINISH_STOP = "stop"        # an end-of-generation token or a stop string
FINISH_LENGTH = "length"    # max_tokens reached, or the context is full


@dataclass
class Timings:
    """As llama-server reports them."""
    prompt_n: int = 0            # prompt tokens evaluated (not those reused from the cache)
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cached_n: int = 0            # prompt tokens whose K/V were reused
    draft_n: int = 0             # speculative decoding: drafted tokens verified
    draft_n_accepted: int = 0    # ... and accepted

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1e3 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms, "prompt_per_second": self.prompt_per_second,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_second": self.predicted_per_second, "cached_n": self.cached_n,
                "cache_n": self.cached_n,   # llama-server's name for it
                **({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n else {})}


@dataclass
class Completion:
    text: str
    tokens: list[int]                 # generated token ids (stop string tokens included)
    prompt_tokens: list[int]
    finish_reason: str
    timings: Timings = field(default_factory=Timings)
    context_full: bool = False        # generation ended because the context had no room (finish_reason "length")
    n_context_shifts: int = 0         # times the context was shifted to make room (LLM(context_shift=True))
    logprobs: list[TokenLogprob] | None = None          # per generated token, when asked for
    prompt_logprobs: list[TokenLogprob] | None = None   # per prompt token (the first: None), when asked for


class Generation:
    """A streamed generation: iterate for text pieces; ``result`` holds the Completion once it is done.

    While it runs, ``tokens`` and ``logprobs`` grow with each sampled token (a piece of text may cover
    several tokens, or none while a possible stop string is held back). ``close()`` ends it early, from any
    thread: called while another thread is inside ``next``, it returns at once and that thread's iteration
    ends after the piece it is producing (a generator cannot be closed while it runs).
    """

    def __init__(self, produce: "Callable[[Generation], Iterator[str]]"):
        """produce(self) yields the pieces and sets ``self.result`` when it finishes."""
        self.result: Completion | None = None
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self._pieces = produce(self)
        self._running = threading.Lock()   # held while a piece is produced
        self._closed = False
        self._runner: int | None = None      # the thread producing a piece now

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> str:
        with self._running:
            if self._closed:
                self._pieces.close()
                raise StopIteration
            self._runner = threading.get_ident()
            try:
                return next(self._pieces)
            finally:
                self._runner = None

    def close(self) -> None:
        if self._runner == threading.get_ident():   # from inside the piece being produced (a callback)
            raise ValueError("generator already executing")
        self._closed = True
        if self._running.acquire(blocking=False):
            try:
                self._pieces.close()
            finally:
                self._running.release()
