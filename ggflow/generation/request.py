"""A request to the engine, the events it sends back, and the refusals a caller can get."""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence, Union

from ggflow.core.sampling import SamplerChain, SamplingParams
from ggflow.errors import GGFlowError
from ggflow.generation.logprobs import TokenLogprob
from ggflow.generation.records import Completion

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
    logprob: TokenLogprob | None = None       # the token's, when the request asked for logprobs


@dataclass
class Done:
    """The request finished; ``completion.finish_reason`` says why ("stop", "length"; "error" with ``error``)."""
    completion: Completion
    error: str | None = None
    exception: BaseException | None = None    # what raised, for a caller in the same process (LLM re-raises it)


Event = Union[Piece, Done]
_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt: Sequence[int]                      # token ids
    on_event: Callable[[Event], None]          # called from the engine thread: keep it short, never block
    max_tokens: int | None = 128               # None: until the end of text (or a full context)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    grammar: "Grammar | None" = None           # constrains the output (ggflow.structured)
    n_top: int | None = None                   # logprobs: each token's and the n_top most likely (None: none)
    prompt_logprobs: bool = False              # the prompt's tokens too (its cached prefix is not reused)
    logits_processors: Sequence[Callable] = ()  # (token_ids, logits) -> logits, first in the chain
    stopping_criteria: Sequence[Callable] = ()  # (token_ids, logits) -> bool: True ends with "stop"
    siblings: Sequence["Request"] = ()         # n > 1: choices that continue from this one's evaluated prompt
    lora: "dict[int, float] | None" = None     # LoRA adapter id -> scale, the others 0 (None: the default mix)
    id_slot: int = -1                          # llama-server's id_slot: decode in this slot only (waits for it)
    id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        self.prompt = [int(t) for t in self.prompt]
        self.chain: SamplerChain | None = None    # built by Engine.submit
        self.constraint: "GrammarSampler | None" = None   # built by Engine.submit from ``grammar``
        self._cancelled = threading.Event()
        self.evicted = False   # set before its Done: ended ("length") to make room in a full shared KV cache

    def cancel(self) -> None:
        """The client went away: the engine frees the request's slot at its next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()
