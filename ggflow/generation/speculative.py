"""Speculative decoding: a drafter proposes the next tokens of a generating sequence, the engine evaluates the
pending token and the whole draft in one batch (logits for every position) and keeps the longest prefix that
the sequence's own sampler chain would have produced.

The acceptance rule is llama.cpp's (common_sampler_sample_and_accept_n): row i is sampled with the request's
chain exactly as plain decoding would sample it; while the sampled token equals the drafted one the next row
is read, and the first differing sample is the correction (the next pending token). Every kept token was
sampled from the target's distribution, with the same random draws in the same order, so greedy output is
token-identical to plain decoding and a seeded sampled generation gives the same text. The chain (and a
grammar in it) only ever accepts tokens it sampled; a stop string, end-of-generation or max_tokens inside the
accepted run ends the generation there. The rejected positions are then removed from the KV cache (seq_rm).

Drafters (``Drafter``): ``LlamaPromptLookupDecoding`` (llama-cpp-python's prompt lookup: the continuation of
the earliest earlier occurrence of the last n-gram), ``NgramSimple`` (llama.cpp's ngram-simple), any
llama-cpp-python ``LlamaDraftModel``-shaped callable ``input_ids -> draft ids``, and a small model with its own
KV cache (draft_model.py).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

from ggflow.errors import ArgumentError
from ggflow.generation.greedy_rows import NO_TOKEN, argmax_rows

MAX_DRAFT = 1024   # the most tokens one draft may hold (llama.cpp bounds its n-gram sizes the same way)


@dataclass
class DraftRequest:
    """One generating sequence asking for a draft: the tokens in its context (the pending one last)."""
    seq_id: int
    tokens: list[int]
    n_max: int          # the most tokens the draft may have here (context room, max_tokens, batch budget)


class Drafter(abc.ABC):
    """Proposes continuations for several sequences at once (a draft model batches them)."""

    @abc.abstractmethod
    def draft(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """A draft (possibly empty, at most ``n_max`` tokens) for each request."""


class LlamaDraftModel(abc.ABC):
    """llama-cpp-python's draft model interface: ``input_ids`` (every token in the context) -> draft ids."""

    @abc.abstractmethod
    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        raise NotImplementedError()


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt lookup decoding (apoorvumang/prompt-lookup-decoding), as llama-cpp-python has it: the last
    ``max_ngram_size`` .. 1 tokens are looked up in the context, and the up to ``num_pred_tokens`` tokens that
    followed their earliest occurrence are the draft. Good where the output copies its input (edits, quotes)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.max_ngram_size = check_range("max_ngram_size", max_ngram_size, 1, MAX_DRAFT)
        self.num_pred_tokens = check_range("num_pred_tokens", num_pred_tokens, 1, MAX_DRAFT)

    @staticmethod
    def find_candidate_pred_tokens(input_ids: npt.NDArray[np.intc], max_ngram_size: int,
                                   num_pred_tokens: int) -> npt.NDArray[np.intc]:
        ids = np.asarray(input_ids)
        n = ids.shape[0]
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ids, (size,))
            matches = np.flatnonzero(np.all(windows == ids[-size:], axis=1))
            starts = matches + size
            starts = starts[starts < n]        # the last n-gram itself has nothing after it
            if len(starts):
                start = int(starts[0])
                return ids[start: min(start + num_pred_tokens, n)]
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)


class NgramSimple(LlamaDraftModel):
    """llama.cpp's ngram-simple (common_ngram_simple_draft): the last ``size_n`` tokens (the sampled one
    last) are looked up backwards in the context before them, and up to ``size_m`` tokens that followed
    the most recent occurrence are the draft (none if fewer than ``size_n`` follow)."""

    def __init__(self, size_n: int = 12, size_m: int = 48):
        self.size_n = check_range("size_n", size_n, 1, MAX_DRAFT)
        self.size_m = check_range("size_m", size_m, 1, MAX_DRAFT)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        ids = np.asarray(input_ids)
        tokens, n = ids[:-1], len(ids) - 1       # llama.cpp's "tokens" leave the sampled token out
        if n <= self.size_n + self.size_m + 1:
            return np.array([], dtype=np.intc)
        pattern = ids[-self.size_n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: n - 1], (self.size_n,))
        found = np.flatnonzero(np.all(windows[1:] == pattern, axis=1)) + 1   # position 0 means "no match"
        if not len(found):
            return np.array([], dtype=np.intc)
        start = int(found[-1]) + self.size_n
        copy = min(self.size_m, n - start)
        return tokens[start: start + copy] if copy >= self.size_n else np.array([], dtype=np.intc)


class CallableDrafter(Drafter):
    """A ``LlamaDraftModel`` (or any callable of that shape) as a Drafter; ids outside the vocabulary end the
    draft there (a drafter's mistake must not reach the model as an invalid token)."""

    def __init__(self, fn: Callable[..., Any], n_vocab: int):
        self.fn, self.n_vocab = fn, n_vocab

    def draft(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        out = []
        for r in requests:
            ids = np.asarray(self.fn(np.asarray(r.tokens, dtype=np.intc)), dtype=np.int64).reshape(-1)[: r.n_max]
            bad = np.flatnonzero((ids < 0) | (ids >= self.n_vocab))
            out.append([int(t) for t in (ids[: bad[0]] if len(bad) else ids)])
        return out


def check_range(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ArgumentError(name, value, f"an integer in [{low}, {high}]")
    return int(value)


def as_drafter(draft_model: Any, n_vocab: int) -> Drafter | None:
    """``LLM(draft_model=...)``: None, a Drafter, or a llama-cpp-python-shaped callable (a path is a draft
    model, loaded by the caller through draft_model.py)."""
    if draft_model is None or isinstance(draft_model, Drafter):
        return draft_model
    if callable(draft_model):
        return CallableDrafter(draft_model, n_vocab)
    raise ArgumentError("draft_model", draft_model, "a path to a GGUF draft model (or a draft_model.DraftModel), "
                        "a LlamaPromptLookupDecoding, or a callable input_ids -> draft token ids (llama-cpp-python's "
                        "LlamaDraftModel)")


# -- the engine's side --------------------------------------------------------------------------------
def can_roll_back(memory: Any) -> bool:
    """Whether rejected draft positions can always be removed again: not from a sliding-window cache smaller
    than the context (writing a draft may evict cells the window then needs after the rollback; llama.cpp
    restores a checkpoint there, which ggflow does not have yet)."""
    swa = getattr(memory, "swa", None)
    return swa is None or getattr(swa, "size", 0) >= getattr(memory, "size", 0)


def add_drafts(drafter: Drafter, entries: list, budget: int, n_ctx: int) -> int:
    """Extend the entries of generating slots ([pending]) with drafts, within ``budget`` batch tokens and the
    room left in each sequence; returns how many draft tokens were added."""
    asks, where = [], []
    for i, (slot, tokens) in enumerate(entries):
        room = n_ctx - len(slot.cache_tokens) - 1      # positions after the pending token
        max_tokens = slot.request.max_tokens
        if max_tokens is not None:                     # each verified row may produce one more token
            room = min(room, max_tokens - len(slot.seq.out) - 1)
        room = min(room, budget - sum(a.n_max for a in asks))
        if room >= 1 and len(tokens) == 1:
            asks.append(DraftRequest(slot.seq_id, slot.cache_tokens + tokens, room))
            where.append(i)
    if not asks:
        return 0
    added = 0
    for i, ask, draft in zip(where, asks, drafter.draft(asks)):
        draft = list(draft)[: ask.n_max]
        if draft:
            slot, tokens = entries[i]
            entries[i] = (slot, tokens + draft)
            added += len(draft)
    return added


def take_drafted(slot: Any, draft: list[int], row: Callable[[int], np.ndarray]) -> tuple[int, int]:
    """Verify a draft whose rows (``row(0)`` after the pending token, ``row(i)`` after draft[i-1]) came out of
    one decode: sample each row with the slot's chain and keep going while the sample equals the draft.
    The slot's cache_tokens grow by the pending token and the accepted draft tokens. Returns (draft tokens
    accepted, tokens taken)."""
    slot.evaluated([slot.pending])
    slot.timings.draft_n += len(draft)   # counted before a token may finish the request (and send its timings)
    n_rows = len(draft) + 1
    picks = None
    if slot.seq.argmax_plan is not None:   # greedy: one argmax over all the rows
        rows = np.stack([row(i) for i in range(n_rows)])   # a copy: biases go in
        picks = argmax_rows(rows, [slot.seq.argmax_plan] * n_rows)
    for i in range(n_rows):
        logits = row(i)
        if picks is not None and picks[i] != NO_TOKEN:
            finished = slot.take_argmax(int(picks[i]), logits if slot.seq.needs_logits else None)
        else:
            finished = slot.sample(logits)
        if finished or i == len(draft) or slot.seq.out[-1] != draft[i]:
            return i, i + 1
        slot.evaluated([draft[i]])      # the drafted token is the one sampled: its K/V stay
        slot.timings.draft_n_accepted += 1
    raise AssertionError("unreachable")
