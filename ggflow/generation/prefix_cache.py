"""The prefix cache shared across slots: which sequence of the KV cache holds the longest prefix of a prompt.

An index of hashed blocks, as vLLM's automatic prefix caching: each holder's reusable tokens are cut into
blocks of BLOCK tokens, block i keyed by a hash chained over blocks 0..i (so a key names a whole prefix, not
a block's content alone), and a dict maps each key to the holders that have it. The deepest key of a prompt
found in the dict names the holders of the longest block-aligned shared prefix; the token-level match with
them (common_prefix_length on the real tokens, never trusting a hash alone) gives the exact length. Hashed
blocks rather than a radix tree: the holders here are a handful of sequences whose tokens only grow between
admissions (a slot's list is extended in place, replaced when it is cut), so each holder's keys are kept
incrementally with a dict update per new block, and a lookup is one hash per prompt block; a radix tree
would need splitting and merging on every change of a slot for the same answer.

The KV cells are not copied: the new slot's sequence is made to see the holder's cells (``Memory.seq_cp``)
and evaluates only the rest of its prompt. A cell is freed when no sequence sees it, so a holder that moves
on keeps nothing alive that it alone used, and a sequence that diverges writes its own tokens to new cells
(copy on write at cell granularity). Prefixes held by idle slots only are the unreferenced ones: they are
dropped least recently used first when the prompts being evaluated need room (the engine's plan) or the
generating slots do (``Engine._make_room``; both ``Engine._drop_idle_caches``).

A request whose prompt shares more with a prompt still being evaluated by another slot than with anything
cached waits in the queue until that slot has evaluated the shared part (``next_request``): 16 requests with
one system prompt arriving together evaluate it once, not once per slot.

Sharing across sequences is only done on the unified KV cache (``KVCache`` itself): a window-sized cache may
no longer hold the cells a copied prefix needs, so other memories keep llama-server's per-slot reuse. Nor
with context shift: a shift moves a sequence's cells (``seq_add``), which cells another sequence sees cannot.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from ggflow.generation.admission import choose_slot, common_prefix_length
from ggflow.generation.slot import Slot, SlotState

BLOCK = 16              # tokens per hashed block (vLLM's default block size)
MIN_WAIT_GAIN = BLOCK   # a request waits for an in-flight prompt only when it would reuse this many more tokens


def shares_across_sequences(memory: Any) -> bool:
    from ggflow.core.kv_cache import KVCache
    return type(memory) is KVCache


def block_keys(tokens: Sequence[int], start_key: int = 0, start_block: int = 0) -> list[int]:
    """The chained keys of the full blocks of ``tokens`` from ``start_block`` on, continuing from the key of
    block start_block - 1 (``start_key``; 0 before the first block)."""
    keys, key = [], start_key
    for b in range(start_block, len(tokens) // BLOCK):
        key = hash((key, tuple(tokens[b * BLOCK:(b + 1) * BLOCK])))
        keys.append(key)
    return keys


class _Holder:
    """One slot's keys, for the tokens list they were computed from (and that list's last hashed block)."""
    __slots__ = ("tokens", "keys", "tail")

    def __init__(self) -> None:
        self.tokens: list[int] | None = None
        self.keys: list[int] = []
        self.tail: list[int] = []

    def still_valid(self, tokens: list[int]) -> bool:
        """The same list, its last hashed block unchanged (a list cut and refilled in place starts over)."""
        n = len(self.keys) * BLOCK
        return self.tokens is tokens and tokens[n - BLOCK: n] == self.tail if n else self.tokens is tokens


class PrefixIndex:
    def __init__(self) -> None:
        self._holders: dict[int, _Holder] = {}          # slot id -> its keys
        self._by_key: dict[int, set[int]] = {}          # key -> slot ids holding that prefix

    def refresh(self, slots: Iterable[Slot]) -> None:
        """Bring every slot's keys up to date with its reusable tokens (new blocks only, where its list grew)."""
        for s in slots:
            h = self._holders.setdefault(s.id, _Holder())
            tokens, n = s.cache_tokens, s.n_reusable // BLOCK
            if not h.still_valid(tokens):          # a new list, or refilled in place: its keys from scratch
                self._drop(s.id, h.keys)
                h.tokens, h.keys = tokens, []
            if n < len(h.keys):                    # shifted or shortened in place: the head is unchanged
                self._drop(s.id, h.keys[n:])
                del h.keys[n:]
            elif n > len(h.keys):
                new = block_keys(tokens[: n * BLOCK], h.keys[-1] if h.keys else 0, len(h.keys))
                for key in new:
                    self._by_key.setdefault(key, set()).add(s.id)
                h.keys.extend(new)
            h.tail = tokens[(n - 1) * BLOCK: n * BLOCK] if n else []

    def _drop(self, slot_id: int, keys: Iterable[int]) -> None:
        for key in keys:
            ids = self._by_key.get(key)
            if ids is not None:
                ids.discard(slot_id)
                if not ids:
                    del self._by_key[key]

    def holders(self, prompt: Sequence[int]) -> list[int]:
        """The slot ids holding the longest block-aligned prefix of ``prompt`` (every slot when none does)."""
        best: set[int] | None = None
        for key in block_keys(prompt):
            ids = self._by_key.get(key)
            if not ids:
                break
            best = ids
        return sorted(best) if best else sorted(self._holders)


class PrefixSharing:
    """The engine's admission with the shared prefix cache: which idle slot takes a request, and from what."""

    def __init__(self, slots: Sequence[Slot], memory: Any, metrics: Any = None, share: bool = True):
        """share=False (an engine with context shift: shared cells cannot move, ``KVCache.seq_add``): each
        slot reuses only its own prefix, as llama-server's slots do."""
        self.slots, self.memory, self.metrics = list(slots), memory, metrics
        self.unified = shares_across_sequences(memory)   # free cells are what a new token needs
        self.enabled = share and self.unified
        self.index = PrefixIndex()

    def longest(self, prompt: Sequence[int], compatible: Callable[[Slot], bool] = lambda s: True
                ) -> tuple[Slot | None, int]:
        """The slot (busy or idle, ``compatible``) whose KV cache holds the longest prefix of ``prompt``, and its
        length."""
        self.index.refresh(self.slots)
        best, n = None, 0
        for sid in self.index.holders(prompt):
            s = self.slots[sid]
            if not compatible(s):
                continue
            k = common_prefix_length(s.reusable_tokens(), prompt)
            if k > n:
                best, n = s, k
        return best, n

    def next_request(self, waiting: Sequence[Any]) -> Any | None:
        """The first waiting request that need not wait for a prefix another slot is evaluating (None: all do)."""
        if not self.enabled:
            return waiting[0] if waiting else None
        evaluating = [s for s in self.slots if s.state is SlotState.PROMPT and s.request is not None]
        for request in waiting:
            if request.cancelled or request.prompt_logprobs or not evaluating:
                return request
            coming = max(min(common_prefix_length(s.request.prompt, request.prompt), len(request.prompt) - 1)
                         for s in evaluating)
            if coming - self.longest(request.prompt)[1] < MIN_WAIT_GAIN:
                return request
        return None

    def place(self, idle: Sequence[Slot], request: Any, compatible: Callable[[Slot], bool] = lambda s: True
              ) -> tuple[Slot, int]:
        """Choose the idle slot for ``request`` and leave in its sequence the cached prefix it starts from;
        returns (slot, tokens reused). The slot's ``cache_tokens`` start with that prefix. Only ``compatible``
        slots' cells are reused (computed as this request's would be: the same LoRA mix).

        The request extends an idle holder in place only where that loses nothing (the holder's whole cache is
        the prefix, or the holder is the slot to recycle anyway); otherwise it takes an empty or the least
        recently used idle slot and sees the holder's cells there, so the holder's other tokens stay cached."""
        prompt = request.prompt
        limit = 0 if request.prompt_logprobs else len(prompt) - 1   # the last token is evaluated for its logits
        if not self.enabled:
            same = [s for s in idle if compatible(s)]
            slot, own = choose_slot(same, prompt) if same else (None, 0)
            if not own:
                slot, own = choose_slot(idle, ())   # the least recently used, nothing reused
            return slot, self._cut(slot, min(own, limit))
        holder, shared = self.longest(prompt, compatible)
        shared = min(shared, limit)
        spare = min(idle, key=lambda s: (len(s.cache_tokens) > 0, s.t_last_used))
        if holder is None or shared == 0:
            return spare, self._cut(spare, 0)
        if holder in idle and (holder is spare or shared >= holder.n_reusable):   # compatible: its mix
            return holder, self._cut(holder, shared)
        self.memory.seq_rm(spare.seq_id, 0, -1)
        self.memory.seq_cp(holder.seq_id, spare.seq_id, 0, shared)
        spare.cache_tokens = list(holder.cache_tokens[:shared])
        spare.n_reusable = shared
        if self.metrics is not None:
            self.metrics.update(prompt_tokens_shared_total=shared)
        return spare, shared

    def _cut(self, slot: Slot, reuse: int) -> int:
        """Keep the first ``reuse`` cached tokens of the slot's sequence; how many it keeps."""
        if not self.memory.seq_rm(slot.seq_id, reuse, -1):   # cannot continue there (a window cache)
            self.memory.seq_rm(slot.seq_id, 0, -1)
            reuse = 0
        return reuse
