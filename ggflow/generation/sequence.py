"""One sequence's generation state: what turns sampled tokens into released text and, at the end, a Completion.

Both doors drive it the same way through a Slot (``LLM`` and every server route): the sampler chain with the
prompt accepted (repetition penalties see it) and the grammar inserted first, the stream decoder (UTF-8
safe), the stop matcher, end-of-generation / stopping criteria / max_tokens checks, log-probabilities of
the prompt and of each sampled token under the raw logits, and the timings.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from ggflow.generation.greedy_rows import argmax_plan
from ggflow.generation.logprobs import TokenLogprob, log_softmax, token_logprob, top_logprobs
from ggflow.generation.records import FINISH_LENGTH, FINISH_STOP, Completion, Timings
from ggflow.generation.stop import StopMatcher


class SequenceState:
    def __init__(self, prompt: Sequence[int], vocab: Any, chain: Any, *, constraint: Any = None,
                 stops: Sequence[str] = (), max_tokens: int | None = None, n_top: int | None = None,
                 prompt_logprobs: bool = False, criteria: Sequence[Callable] = (), n_reused: int = 0):
        self.prompt, self.vocab, self.chain = list(prompt), vocab, chain
        for tok in self.prompt:       # repetition penalties look at the prompt too
            chain.accept(tok)
        if constraint is not None:    # after the prompt: prompt tokens are not grammar tokens
            chain.samplers.insert(0, constraint)
        self.argmax_plan = argmax_plan(chain)   # not None: the token may be picked by one argmax over rows
        self.decoder = vocab.stream_decoder()
        self.stops = StopMatcher(stops)
        self.max_tokens, self.n_top, self.criteria = max_tokens, n_top, list(criteria)
        self.out: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if n_top is not None else None
        self.prompt_logprobs: list[TokenLogprob] | None = [] if prompt_logprobs else None
        self._prev_row: np.ndarray | None = None   # log-softmax of the row before the next prompt token
        self.n_shifts = 0
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.timings = Timings(prompt_n=len(self.prompt) - n_reused, cached_n=n_reused)

    @property
    def needs_logits(self) -> bool:
        """Whether taking a token reads its logits row (logprobs, stopping criteria)."""
        return self.logprobs is not None or bool(self.criteria)

    def score_prompt(self, tokens: Sequence[int], rows: np.ndarray) -> None:
        """Prompt logprobs of an evaluated chunk of the prompt from its logits rows (token i is scored by the
        row before it; the prompt's first token has no score)."""
        lp = log_softmax(rows)
        n_top = self.n_top or 0
        for j, tok in enumerate(tokens):
            prev = self._prev_row if j == 0 else lp[j - 1]
            if prev is None:
                self.prompt_logprobs.append(TokenLogprob(int(tok), None, []))
            else:
                self.prompt_logprobs.append(TokenLogprob(int(tok), float(prev[tok]), top_logprobs(prev, n_top)))
        self._prev_row = lp[-1]

    def sample(self, logits: np.ndarray) -> int:
        self._first_token_time()
        return self.chain.sample(logits)

    def accept_argmax(self, token: int) -> int:
        """A token picked by argmax_rows with this state's ``argmax_plan`` (what its chain would sample)."""
        self._first_token_time()
        self.chain.accept(token)
        return token

    def _first_token_time(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
            self.timings.prompt_ms = 1e3 * (self.t_first - self.t_start)

    def take(self, token: int, logits: np.ndarray | None) -> tuple[str, str | None]:
        """Record the sampled token: (the text it releases, the finish reason if the generation ends here).
        ``logits`` (its row) is read only when ``needs_logits``."""
        self.out.append(token)
        if self.logprobs is not None:
            self.logprobs.append(token_logprob(logits, token, self.n_top))
        if self.vocab.is_eog(token):
            return "", FINISH_STOP
        piece, hit = self.stops.push(self.decoder.feed(token))
        if hit or (self.criteria and any(c(np.asarray(self.prompt + self.out, np.intc), logits)
                                         for c in self.criteria)):
            return piece, FINISH_STOP
        if self.max_tokens is not None and len(self.out) >= self.max_tokens:
            return piece, FINISH_LENGTH   # the token need not be evaluated: nobody reads its logits
        return piece, None

    def finish(self, reason: str, release: bool = True, context_full: bool = False) -> tuple[str, Completion]:
        """(text still held by the decoder and the stop matcher, unless ``release`` is False; the Completion)."""
        tail = ""
        if release and not self.stops.hit:
            tail, _ = self.stops.push(self.decoder.flush(), final=True)
        now = time.perf_counter()
        t = self.timings
        t.predicted_n = len(self.out)
        t.predicted_ms = 1e3 * (now - self.t_first) if self.t_first is not None else 0.0
        if self.t_first is None:
            t.prompt_ms = 1e3 * (now - self.t_start)
        return tail, Completion(self.stops.text, list(self.out), list(self.prompt), reason, t, context_full,
                                self.n_shifts, None if self.logprobs is None else list(self.logprobs),
                                None if self.prompt_logprobs is None else list(self.prompt_logprobs))
