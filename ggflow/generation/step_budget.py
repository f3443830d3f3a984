"""How many prompt and side-work tokens one engine step may evaluate next to the generating slots' rows.

llama-server evaluates up to ``n_batch`` tokens per step, so a 2,048-token prompt chunk makes every
generating stream wait for it. Here, while a slot generates, the step's extra tokens (prompt chunks,
embedding pieces) are sized from measured step times so that a step takes at most ``latency_factor`` times
a step of the generating rows alone: extra = (factor - 1) * t_rows / t_token, kept in
[``min_tokens``, n_batch - rows] so a prompt always makes progress. With no slot generating nothing waits on
the step, and the whole ``n_batch`` is used. Both times are running averages (they grow with the KV length),
so the budget follows the machine and the backend (a GPU, for which a wide batch costs about what one row
does, gets the whole ``n_batch``); it is rounded down to a power of two so few step shapes are built.
Chunk sizes do not change greedy outputs: a row's result does not depend on the batch it is evaluated in.
"""
from __future__ import annotations

LATENCY_FACTOR = 2.0   # a step with extra tokens takes at most this many times a rows-only step
MIN_TOKENS = 4         # the least a step gives to prompt chunks and side work, whatever the times
FIRST_TOKENS = 8       # before anything is measured
SMOOTHING = 0.2        # weight of the newest measurement in the running averages
FLOOR_S = 1e-4         # an average this small may still grow 3x per measurement


class StepBudget:
    def __init__(self, n_batch: int, latency_factor: float = LATENCY_FACTOR, min_tokens: int = MIN_TOKENS):
        self.n_batch = max(1, int(n_batch))
        self.latency_factor = float(latency_factor)
        self.min_tokens = max(1, min(int(min_tokens), self.n_batch))
        self.t_rows: float | None = None    # seconds of a step that evaluates only generating rows
        self.t_token: float | None = None   # seconds each extra token adds to a step

    def extra_tokens(self, n_rows: int) -> int:
        """The tokens a step with ``n_rows`` generating rows may add (prompt chunks and side work together)."""
        room = max(self.n_batch - n_rows, 0)
        if n_rows == 0:
            return room
        if self.t_rows is None or self.t_token is None:
            return min(room, max(FIRST_TOKENS, self.min_tokens))
        n = int((self.latency_factor - 1.0) * self.t_rows / max(self.t_token, 1e-9))
        return min(room, _power_of_two_below(max(n, self.min_tokens)))

    def side_tokens(self, n_rows: int, n_prompt: int) -> int:
        """The tokens of this step's side work (side_work.py), after ``n_prompt`` prompt tokens. Its piece is a
        decode of its own, whose fixed cost is about a rows-only step's: while slots generate it gets half the
        budget (what the prompt chunks left of it), at least ``min_tokens``."""
        extra = self.extra_tokens(n_rows)
        if n_rows == 0:
            return max(extra - n_prompt, self.min_tokens)
        return max(min(extra // 2, extra - n_prompt), self.min_tokens)

    def observe(self, n_rows: int, n_extra: int, seconds: float) -> None:
        """A step evaluated ``n_rows`` generating rows and ``n_extra`` prompt tokens in one decode, in ``seconds``
        (steps with side work are not observed: their second decode is no measure of a token's cost)."""
        if n_rows > 0 and n_extra == 0:
            self.t_rows = _average(self.t_rows, seconds)
        elif n_extra > 0 and self.t_rows is not None:
            base = self.t_rows if n_rows > 0 else 0.0
            self.t_token = _average(self.t_token, max(seconds - base, 0.0) / n_extra)


def _average(old: float | None, new: float) -> float:
    """A running average; one slow step (a graph built for a new shape, the machine busy) counts as 3x."""
    return new if old is None else (1.0 - SMOOTHING) * old + SMOOTHING * min(new, 3.0 * max(old, FLOOR_S))


def _power_of_two_below(n: int) -> int:
    """Budgets from a few sizes, so the step graphs built for them are reused (Context keeps 16)."""
    return 1 << (max(n, 1).bit_length() - 1)
