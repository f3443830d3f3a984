"""A request to the engine, the events it sends back, and the refusals a caller can get."""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence, Union

from ggflow.api import Completion
from ggflow.core.sampling import SamplerChain, SamplingParams
from ggflow.errors import GGFlowError

if TYPE_CHECKING:
    from ggflow.structured import Grammar, GrammarSampler


class QueueFullError(GGFlowError):
    """Every slot is busy and the waiting queue is at its bound (HTTP 503)."""


class EngineStoppedError(GGFlowError):
    """The engine is shutting down and takes no new requests (HTTP 503)."""


class PromptTooLongError(GGFlowError, ValueError):
    """A prompt with more tokens than a sequence may hold (HTTP 400)."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int):
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx
        super().__init__(f"the prompt has {n_prompt_tokens} tokens but the context holds {n_ctx}: "
                         f"shorten the prompt or start the server with a larger context (-c)")


@dataclass
class Piece:
    """Text released by one sampled token (may be empty while UTF-8 or a stop string is incomplete)."""
    text: str
    token: int


@dataclass
class Done:
    """The request finished; ``completion.finish_reason`` says why ("stop", "length"; "error" with ``error``)."""
    completion: Completion
    error: str | None = None


Event = Union[Piece, Done]
_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt: Sequence[int]                      # token ids
    on_event: Callable[[Event], None]          # called from the engine thread: keep it short, never block
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    grammar: "Grammar | None" = None           # constrains the output (ggflow.structured)
    id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        self.prompt = [int(t) for t in self.prompt]
        self.chain: SamplerChain | None = None    # built by Engine.submit
        self.constraint: "GrammarSampler | None" = None   # built by Engine.submit from ``grammar``
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """The client went away: the engine frees the request's slot at its next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()
