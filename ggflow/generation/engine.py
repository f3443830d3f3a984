"""The engine: N slots over one KV cache, and one ``ctx.decode`` per step for all of them.

Each step (llama-server's ``update_slots``):
  1. free the slots of cancelled requests; admit waiting requests into idle slots, each starting from the
     longest prefix any slot's cache holds (prefix_cache.py: shared cells, evaluating only the rest);
  2. plan one batch: the pending token of every generating slot, then chunks of prompts still being
     evaluated, up to ``n_batch`` tokens (fewer while slots generate: step_budget.py) and never more than
     the KV cache has free cells. When the
     generating slots alone do not fit, idle slots' caches are dropped first; if that is not enough,
     the active slot holding the most cells is finished with "length" (so the others go on untouched);
  3. decode it; status 1 (no room, cache unchanged) defers the prompt chunks and retries;
  4. sample a token for every slot whose logits came out, with that request's own sampler chain (the
     greedy chains that reduce to an argmax: one argmax over all their rows, greedy_rows.py).
  5. run a piece of the side work (embeddings, rerank: side_work.py) with what is left of the step's budget.

A request with ``siblings`` (n > 1 choices) is admitted into that many idle slots at once: one evaluates the
prompt, the others wait (FORKED) and then share its cells (``seq_cp``) and sample from the same logits row.
With ``context_shift`` a sequence that fills the context is shifted (context_shift.py) instead of ending.

The engine is the only code that touches the Context. Other threads only call ``submit`` (and a
request's ``cancel``) and read ``metrics`` / ``slots_snapshot``; ``run_forever`` is the engine thread. ``LLM``
runs an engine of one slot without a thread: it calls ``step`` itself, holding its caller lock.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence

import numpy as np

from ggflow.core.batch import Batch
from ggflow.core.memory import MAX_SEQ
from ggflow.core.sampling import LogitsProcessorSampler, build_chain
from ggflow.errors import ContextFullError, GGFlowError
from ggflow.generation.context_shift import shift_sequence
from ggflow.generation.greedy_rows import NO_TOKEN, argmax_rows
from ggflow.generation.lora_slots import check_request, holds_mix, mix_for, share_mix, take_mix
from ggflow.generation.metrics import EngineMetrics
from ggflow.generation.prefix_cache import PrefixSharing
from ggflow.generation.records import Timings
from ggflow.generation.request import EngineStoppedError, PromptTooLongError, QueueFullError, Request
from ggflow.generation.side_work import SideJob, SideWork
from ggflow.generation.slot import FINISH_CANCELLED, FINISH_ERROR, FINISH_LENGTH, Slot, SlotState
from ggflow.generation.speculative import add_drafts, can_roll_back, take_drafted
from ggflow.generation.step_budget import StepBudget

log = logging.getLogger(__name__)
DECODE_NO_KV_SLOT = 1

Entry = tuple[Slot, list[int]]   # a slot and the tokens it evaluates this step


class Engine:
    def __init__(self, context: Any, *, n_slots: int = 4, n_batch: int | None = None, max_queue: int = 64,
                 first_seq_id: int = 0, context_shift: bool = False, n_keep: int = 0, slot_share: bool = False):
        """Serve requests over ``context``'s KV cache with sequence ids first_seq_id .. +n_slots-1.

        A sequence id outside that range (e.g. one of another engine on the same Context) is left alone.
        ``context_shift``: a sequence that fills the context drops half of what follows its first ``n_keep``
        tokens and goes on (generation/context_shift.py) instead of ending with "length".
        ``slot_share``: each slot may hold 1/n_slots of the cache (llama-server's n_ctx / np), so no slot is ever
        ended to make room for another, and a longer prompt is refused at submit; default: one shared cache.
        """
        n_seq_max = int(getattr(context.memory, "n_seq_max", MAX_SEQ))
        if n_slots < 1 or first_seq_id < 0 or first_seq_id + n_slots > n_seq_max:
            raise GGFlowError(f"n_slots must be in [1, {n_seq_max - first_seq_id}] (the KV cache tracks "
                              f"{n_seq_max} sequences), got {n_slots}")
        if max_queue < 0:
            raise GGFlowError(f"max_queue must be >= 0, got {max_queue}")
        self.ctx = context
        self.vocab = context.model.vocab
        self.n_ctx = context.n_ctx                     # the most tokens one sequence may hold
        if slot_share:
            self.n_ctx = max(1, min(self.n_ctx, self._cache_size() // n_slots))
        self.n_batch = max(1, n_batch or context.n_ubatch)
        self.max_queue = max_queue
        self.slots = [Slot(i, first_seq_id + i, self.n_ctx) for i in range(n_slots)]
        self.context_shift, self.n_keep = bool(context_shift), n_keep
        for s in self.slots:
            s.context_shift = self.context_shift
        self.metrics = EngineMetrics(self._cache_size())
        self._prefixes = PrefixSharing(self.slots, context.memory, self.metrics,
                                       share=not self.context_shift)
        self._waiting: collections.deque[Request] = collections.deque()
        self._calls: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._cond = threading.Condition()
        self._n_idle = n_slots                          # read by submit() under the lock
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._slots_snapshot = [s.snapshot() for s in self.slots]
        self._n_tokens_max = 0                          # the longest sequence so far (/metrics)
        self.drafter = None                             # speculative decoding (speculative.py), when set
        self.side = SideWork()                          # embeddings, rerank: a piece per step (side_work.py)
        self.budget = StepBudget(self.n_batch)          # prompt + side tokens per step (step_budget.py)

    @classmethod
    def load(cls, model_path: str, *, n_ctx: int = 8192, n_slots: int = 4, n_batch: int | None = None,
             max_queue: int = 64, backends: "str | Sequence[str]" = "auto", n_threads: int | None = None,
             n_ubatch: int = 512, type_k: str = "F16", type_v: str = "F16", context_shift: bool = False,
             n_keep: int = 0, slot_share: bool = False) -> "Engine":
        from ggflow.core.context import Context
        from ggflow.core.model import Model

        model = Model.load(model_path)
        ctx = Context(model, n_ctx=n_ctx, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                      backends=backends, n_threads=n_threads)
        return cls(ctx, n_slots=n_slots, n_batch=n_batch, max_queue=max_queue, context_shift=context_shift,
                   n_keep=n_keep, slot_share=slot_share)

    # -- called from any thread --------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue a request; raises PromptTooLongError, QueueFullError or EngineStoppedError (nothing queued)."""
        self.prepare(request)
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the server is shutting down and takes no new requests")
            if len(self._waiting) - self._n_idle >= self.max_queue:
                raise QueueFullError(f"all {len(self.slots)} slots are busy and {self.max_queue} requests "
                                     f"are already waiting; try again later")
            self._waiting.append(request)
            self._cond.notify()

    def prepare(self, request: Request) -> None:
        """Check a request and build its sampler chains (its siblings' too) in the caller's thread: bad options
        are the caller's error, not the engine's."""
        if not -1 <= request.id_slot < len(self.slots) or (request.id_slot >= 0 and request.siblings):
            raise GGFlowError(f"id_slot {request.id_slot}: the slots are 0..{len(self.slots) - 1} (-1: any), "
                              f"for one choice")
        if request.siblings and 1 + len(request.siblings) > len(self.slots):
            raise GGFlowError(f"n={1 + len(request.siblings)} choices need as many slots; this engine has "
                              f"{len(self.slots)} (ggflow serve -np)")
        for r in (request, *request.siblings):
            if r.chain is None:
                self._check(r)

    def _check(self, request: Request) -> None:
        n = len(request.prompt)
        if n == 0:
            raise GGFlowError("the prompt is empty (no tokens to condition on)")
        if n > self.n_ctx:
            raise PromptTooLongError(n, self.n_ctx)
        bad = [t for t in request.prompt if not 0 <= t < self.vocab.n_vocab]
        if bad:
            raise GGFlowError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab.n_vocab})")
        if request.max_tokens is not None and request.max_tokens < 1:
            raise GGFlowError(f"max_tokens must be at least 1, got {request.max_tokens}")
        check_request(self.ctx, request)
        chain = build_chain(request.sampling, vocab_size=self.vocab.n_vocab, vocab=self.vocab)
        for fn in reversed(request.logits_processors):
            chain.samplers.insert(0, LogitsProcessorSampler(fn))
        request.chain = chain
        if request.grammar is not None:   # a grammar the vocabulary cannot use is refused here too
            from ggflow.structured import GrammarSampler
            request.constraint = GrammarSampler(request.grammar, self.vocab)
            request.constraint.check_start()   # a grammar that cannot start is refused, not a 500 mid-step

    def call_soon(self, fn: Callable[[], Any]) -> Future:
        """Run fn in the engine thread before its next step (the Context is touched only there)."""
        future: Future = Future()
        with self._cond:
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def run_side(self, job: SideJob) -> Future:
        """Run a piece-wise job in the engine thread, a piece per step between the slots' decodes."""
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the server is shutting down and takes no new requests")
            future = self.side.submit(job)
            self._cond.notify()
        return future

    def erase_slot(self, slot_id: int) -> Future:
        """llama-server's slot erase: forget an idle slot's cached tokens; the future gives how many."""
        if not 0 <= slot_id < len(self.slots):
            raise GGFlowError(f"there is no slot {slot_id}: the slots are 0..{len(self.slots) - 1}")
        slot = self.slots[slot_id]

        def erase() -> int:
            if slot.is_busy:
                raise GGFlowError(f"slot {slot_id} is processing a request; erase it when it is idle")
            n = len(slot.cache_tokens)
            self._forget_cache(slot)
            return n
        return self.call_soon(erase)

    def clear_cache(self) -> None:
        """Forget every idle slot's cached tokens (engine thread, or while the engine is not running)."""
        for s in self.slots:
            if not s.is_busy:
                self._forget_cache(s)
        self._publish()

    def slots_snapshot(self) -> list[dict[str, Any]]:
        return self._slots_snapshot

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    # -- the engine thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="ggflow-engine", daemon=True)
        self._thread.start()

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new requests; finish those in flight and queued (drain) or cancel them; end the thread."""
        with self._cond:
            self._stopping = True
            if not drain:
                for r in self._waiting:
                    r.cancel()
                for s in self.slots:
                    if s.request is not None:
                        s.request.cancel()
                self.side.abandon_all(EngineStoppedError("the server is shutting down"))
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_forever(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._calls and not self._any_busy() and not self._stopping \
                        and not self.side.pending:
                    self._cond.wait(0.5)
                if self._stopping and not self._waiting and not self._calls and not self._any_busy() \
                        and not self.side.pending:
                    return
            self.step()

    def run_until_idle(self, timeout: float | None = None) -> None:
        """Step in the calling thread until nothing is waiting or running (offline batches, tests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._waiting or self._calls or self._any_busy() or self.side.pending:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the engine was still busy after {timeout} s")
            self.step()

    def _any_busy(self) -> bool:
        return any(s.is_busy for s in self.slots)

    # -- one step ------------------------------------------------------------------------------------
    def step(self) -> None:
        """Admit, plan, decode once, sample. An unexpected failure ends the requests in flight, not the engine."""
        self._run_calls()
        try:
            self._drop_cancelled()
            self._admit()
            t0 = time.perf_counter()
            entries = self._plan()
            n_rows = sum(s.state is SlotState.GENERATING for s, _ in entries)
            n_extra = sum(len(t) for _, t in entries) - n_rows
            if entries:
                self._decode(entries)
            n_side = 0
            if self.side.pending:   # a piece of side work after the slots' decode (side_work.py)
                n_side = self.side.run(self.budget.side_tokens(n_rows, n_extra), self._free_cells() - 2 * n_rows)
            if (n_rows or n_extra) and not n_side:
                self.budget.observe(n_rows, n_extra, time.perf_counter() - t0)
        except Exception as exc:  # a bug or a backend failure: report it to every request in flight
            log.exception("engine step failed")
            for s in self.slots:
                if s.request is not None:
                    self._forget_cache(s)
                    self._record_finished(s.finish(FINISH_ERROR, error=f"{type(exc).__name__}: {exc}",
                                                   exception=exc).timings)
        finally:
            self._publish()

    def _run_calls(self) -> None:
        while self._calls:
            with self._cond:
                fn, future = self._calls.popleft()
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.request is not None and s.request.cancelled:
                self._record_finished(s.finish(FINISH_CANCELLED).timings)
        for s in self.slots:   # siblings whose shared prompt ended before it was evaluated cannot go on alone
            if s.state is SlotState.FORKED and (s.leader.request is None or s not in s.leader.forks):
                self._record_finished(s.finish(FINISH_ERROR, error="the prompt this choice shares ended before "
                                               "it was evaluated").timings)

    def _admit(self) -> None:
        while True:
            idle = [s for s in self.slots if not s.is_busy]
            with self._cond:
                if not idle or not self._waiting:
                    self._n_idle = len(idle)
                    return
                request = self._prefixes.next_request(self._waiting)
                if request is None:         # each waits for a prefix another slot is evaluating
                    self._n_idle = len(idle)
                    return
                if 1 + len(request.siblings) > len(idle) and not request.cancelled:
                    self._n_idle = 0        # n choices start together: wait for that many idle slots
                    return
                candidates = idle
                if request.id_slot >= 0 and not request.cancelled:   # a pinned request waits for its slot
                    candidates = [s for s in idle if s.id == request.id_slot]
                    if not candidates:
                        self._n_idle = 0
                        return
                self._waiting.remove(request)
                self._n_idle = len(idle) - (0 if request.cancelled else 1 + len(request.siblings))
            if request.cancelled:
                continue
            mix = mix_for(self.ctx, request)   # its LoRA mix: cached cells are shared only among the same (lora_slots.py)
            slot, reuse = self._prefixes.place(candidates, request, lambda s: holds_mix(self.ctx, s, mix))
            take_mix(self.ctx, slot, mix)
            slot.assign(request, reuse, self.vocab)
            others = sorted((s for s in idle if s is not slot), key=lambda s: s.t_last_used)
            slot.forks = others[: len(request.siblings)]
            for fork, sibling in zip(slot.forks, request.siblings):
                self._forget_cache(fork)
                share_mix(self.ctx, slot, fork)
                fork.assign(sibling, 0, self.vocab, forked=True)
                fork.leader = slot

    def _plan(self) -> list[Entry]:
        """This step's tokens, slot by slot, fitting the batch budget and the free KV cells."""
        while True:
            busy = [s for s in self.slots if s.is_busy]
            if not busy:
                return []
            generating = [s for s in busy if s.state is SlotState.GENERATING]
            full = [s for s in generating if len(s.cache_tokens) >= self.n_ctx]   # only with context shift
            if full:
                self._shift(full[0])
                continue
            free = self._free_cells()
            need = max(len(generating), 1)
            if need > free:
                self._make_room(need - free)
                continue
            prompting = sum(len(s.prompt_left()) for s in busy if s.state is SlotState.PROMPT)
            short = min(self.n_batch - len(generating), prompting) - (free - 2 * len(generating))
            if short > 0 and self._prefixes.unified and self._drop_idle_caches(short):
                continue                     # idle slots' prefixes made room for the prompts (LRU first)
            entries: list[Entry] = [(s, s.tokens_to_evaluate(1)) for s in generating]
            # prompt chunks leave room for the generating slots' next tokens, so a long prompt arriving
            # late waits instead of filling the cache and forcing a running slot to finish; they fit the step
            # budget (step_budget.py), half of it when side work waits too
            extra = self.budget.extra_tokens(len(generating))
            budget = min(extra - (extra // 2 if self.side.pending else 0), free - 2 * len(generating))
            if self.drafter is not None and generating and can_roll_back(self.ctx.memory):
                budget -= add_drafts(self.drafter, entries, budget, self.n_ctx)
            for s in busy:
                if s.state is SlotState.PROMPT and budget > 0:
                    chunk = s.tokens_to_evaluate(budget)
                    entries.append((s, chunk))
                    budget -= len(chunk)
            return entries

    def _make_room(self, n_cells: int) -> None:
        """Free n_cells: drop idle slots' caches (least recently used first), else shift (context_shift) or
        finish the largest slot."""
        if self._drop_idle_caches(n_cells) >= n_cells:
            return
        if self.side.release_cells():   # an embedding's cells first: it starts that input again later
            return
        largest = max((s for s in self.slots if s.is_busy), key=lambda s: len(s.cache_tokens))
        if self.context_shift and largest.state is SlotState.GENERATING:
            self._shift(largest)
            return
        self._forget_cache(largest)
        largest.request.evicted = True   # said in the response and counted (/metrics), not hidden as "length"
        self.metrics.update(n_evicted_total=1)
        self._record_finished(largest.finish(FINISH_LENGTH, context_full=True).timings)

    def _shift(self, slot: Slot) -> None:
        """Context shift of a generating slot; one that cannot shift ends with "length" (the error attached)."""
        try:
            slot.n_reusable = min(slot.n_reusable, shift_sequence(self.ctx.memory, slot.seq_id, slot.cache_tokens,
                                                                  self.n_keep, self.vocab.bos_id))
            slot.seq.n_shifts += 1
        except ContextFullError as exc:
            self._forget_cache(slot)
            self._record_finished(slot.finish(FINISH_LENGTH, context_full=True, exception=exc).timings)

    def _drop_idle_caches(self, n_cells: int) -> int:
        """Forget idle slots' cached tokens, least recently used first, until n_cells are freed; the cells freed
        (cells another sequence still sees stay)."""
        freed = 0
        for s in sorted((s for s in self.slots if not s.is_busy and s.cache_tokens), key=lambda s: s.t_last_used):
            if freed >= n_cells:
                break
            freed += self._forget_cache(s)
        return freed

    def _forget_cache(self, slot: Slot) -> int:
        before = self.ctx.memory.n_used
        self.ctx.memory.seq_rm(slot.seq_id, 0, -1)
        slot.cache_tokens, slot.n_reusable = [], 0
        return before - self.ctx.memory.n_used

    def _decode(self, entries: list[Entry]) -> None:
        batch = self._batch(entries)
        status = self.ctx.decode(batch)
        if status == DECODE_NO_KV_SLOT:
            generating = [(s, t) for s, t in entries if s.state is SlotState.GENERATING]
            if len(generating) < len(entries) and generating:
                entries = generating          # defer the prompt chunks to a later step
                status = self.ctx.decode(self._batch(entries))
            if status == DECODE_NO_KV_SLOT:  # the memory counts cells differently than we did: make room
                self._make_room(1)
                return
        if status != 0:
            raise GGFlowError(f"decode failed with status {status}")
        self.metrics.update(n_decode_total=1, n_busy_slots_total=sum(s.is_busy for s in self.slots))
        index, sampled, drafted = -1, [], []
        for slot, tokens in entries:
            if slot.state is SlotState.GENERATING and len(tokens) > 1:   # pending + draft: verified below
                drafted.append((slot, tokens[1:], index + 1))
                index += len(tokens)
                continue
            slot.evaluated(tokens)
            if slot.state is SlotState.PROMPT and slot.seq.prompt_logprobs is not None:
                rows = np.stack([self.ctx.get_logits_ith(i) for i in range(index + 1, index + 1 + len(tokens))])
                slot.seq.score_prompt(tokens, rows)
            index += len(tokens)
            if slot.state is SlotState.GENERATING or not slot.prompt_left():
                sampled.append((slot, index))
                sampled.extend((fork, index) for fork in self._fork(slot))
        for (slot, index), token in zip(sampled, self._argmax_tokens(sampled)):
            was_prompt = slot.state is SlotState.PROMPT
            try:
                finished = (slot.sample(self.ctx.get_logits_ith(index)) if token == NO_TOKEN else
                            slot.take_argmax(int(token), self.ctx.get_logits_ith(index) if slot.seq.needs_logits
                                             else None))
            except Exception as exc:  # one request's sampler failed: end that request, not the step
                log.exception("sampling failed")
                self._forget_cache(slot)
                self._record_finished(slot.finish(FINISH_ERROR, error=f"{type(exc).__name__}: {exc}",
                                                  exception=exc).timings)
                continue
            self.metrics.update(tokens_predicted_total=1)
            if was_prompt:
                t = slot.timings
                self.metrics.update(prompt_tokens_total=t.prompt_n, prompt_tokens_cached_total=t.cached_n,
                                    prompt_seconds_total=t.prompt_ms / 1e3)
            if finished:
                self._record_finished(slot.timings)
        for slot, draft, first in drafted:
            self._verify(slot, draft, first)

    def _verify(self, slot: Slot, draft: list[int], first: int) -> None:
        """Keep the longest drafted run the slot's chain samples (speculative.py); drop the rest's K/V."""
        try:
            n_accepted, n_taken = take_drafted(slot, draft, lambda i: self.ctx.get_logits_ith(first + i))
        except Exception as exc:  # one request's sampler failed: end that request, not the step
            log.exception("sampling failed")
            self._forget_cache(slot)
            self._record_finished(slot.finish(FINISH_ERROR, error=f"{type(exc).__name__}: {exc}",
                                              exception=exc).timings)
            return
        if not self.ctx.memory.seq_rm(slot.seq_id, len(slot.cache_tokens), -1):
            raise GGFlowError(f"the KV cache could not remove the rejected draft of sequence {slot.seq_id}")
        self.metrics.update(tokens_predicted_total=n_taken, spec_decode_num_draft_tokens_total=len(draft),
                            spec_decode_num_accepted_tokens_total=n_accepted, spec_decode_num_drafts_total=1)
        if slot.request is None:
            self._record_finished(slot.timings)

    def _fork(self, slot: Slot) -> list[Slot]:
        """n > 1: the sibling choices waiting for ``slot``'s prompt share its cells from now on."""
        forks, slot.forks = [s for s in slot.forks if s.state is SlotState.FORKED and s.leader is slot], []
        for fork in forks:
            self.ctx.memory.seq_rm(fork.seq_id, 0, -1)
            self.ctx.memory.seq_cp(slot.seq_id, fork.seq_id, 0, -1)
            fork.fork_from(slot)
        return forks

    def _argmax_tokens(self, sampled: list[tuple[Slot, int]]) -> np.ndarray:
        """The tokens of the greedy slots in one argmax over their logit rows; NO_TOKEN: the chain samples."""
        tokens = np.full(len(sampled), NO_TOKEN, np.int64)
        greedy = [i for i, (slot, _) in enumerate(sampled) if slot.seq.argmax_plan is not None]
        if greedy:
            rows = np.stack([self.ctx.get_logits_ith(sampled[i][1]) for i in greedy])   # a copy: biases go in
            tokens[greedy] = argmax_rows(rows, [sampled[i][0].seq.argmax_plan for i in greedy])
        return tokens

    def _batch(self, entries: list[Entry]) -> Batch:
        tokens = np.concatenate([np.asarray(t, np.int32) for _, t in entries])
        pos = np.concatenate([np.arange(len(s.cache_tokens), len(s.cache_tokens) + len(t)) for s, t in entries])
        seq = np.concatenate([np.full(len(t), s.seq_id) for s, t in entries])
        wants = [s.state is SlotState.GENERATING or len(t) == len(s.prompt_left()) for s, t in entries]
        logits = np.concatenate([np.ones(len(t), bool) if s.state is SlotState.GENERATING or (
                                 s.state is SlotState.PROMPT and s.request.prompt_logprobs)
                                 else np.arange(len(t)) == len(t) - 1 if w else np.zeros(len(t), bool)
                                 for (s, t), w in zip(entries, wants)])
        return Batch(tokens, pos, seq, logits)

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _record_finished(self, timings: Timings) -> None:
        self.metrics.update(tokens_predicted_seconds_total=timings.predicted_ms / 1e3)

    def _free_cells(self) -> int:
        return self._cache_size() - self.ctx.memory.n_used

    def _cache_size(self) -> int:
        return int(getattr(self.ctx.memory, "size", self.ctx.n_ctx))

    def _publish(self) -> None:
        busy = sum(s.is_busy for s in self.slots)
        self._n_tokens_max = max(self._n_tokens_max, max(len(s.cache_tokens) for s in self.slots))
        self.metrics.set(requests_processing=busy, requests_deferred=len(self._waiting),
                         kv_cache_tokens=self.ctx.memory.n_used, n_tokens_max=self._n_tokens_max)
        self._slots_snapshot = [s.snapshot() for s in self.slots]
