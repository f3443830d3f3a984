"""Prefix-aware routing for the Ray Serve deployment: a chat's next turn goes where its prefix is cached.

Two halves. ``prefix_keys`` runs in the ingress: it turns a request body into the hashes of the prompt's
prefixes (one per chat message; one per block of characters or tokens for a completion), cheap and without
a tokenizer. ``PrefixAffinityRouter`` runs inside every handle that calls the model deployment: it remembers
which replica each prefix hash was last sent to, and sends a request to the replica holding its longest
known prefix, unless that replica is busy (``busy_threshold`` requests in flight: all its slots taken), in
which case the least loaded replica serves it and becomes the prefix's new owner.

The memory is per router (per ingress replica); that is a cache hint, never a correctness matter: a wrong
guess costs one prompt evaluation, as with any other router.
"""
from __future__ import annotations

import collections
import hashlib
import json
from typing import Any, Iterable, Sequence

CHARS_PER_BLOCK = 64      # a completion prompt's prefixes: every 64 characters
TOKENS_PER_BLOCK = 32     # a token-id prompt's prefixes: every 32 tokens
MAX_KEYS = 64             # prefixes per request (a longer prompt's tail adds nothing to the routing)
MAX_REMEMBERED = 100_000  # prefix hashes a router remembers, least recently used forgotten first
ROUTE_KWARG = "prefix_keys"


def _chain(parts: Iterable[bytes]) -> list[str]:
    """Hash of every prefix of ``parts``: h_i = H(h_{i-1} || part_i), so equal prefixes give equal keys."""
    keys: list[str] = []
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if len(keys) == MAX_KEYS:
            break
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
        keys.append(h.copy().hexdigest())
    return keys


def _blocks(seq: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [seq[i:i + size] for i in range(0, len(seq), size)]


def prefix_keys(path: str, body: bytes) -> list[str]:
    """The prefix hashes of a request to ``path`` (empty when the route has no prompt or the body is not JSON)."""
    if not path.endswith("completions"):
        return []
    try:
        data = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return []
    if not isinstance(data, dict):
        return []
    if path.endswith("chat/completions"):
        messages = data.get("messages")
        if not isinstance(messages, list):
            return []
        # a message is one unit: turn n+1 repeats turn n's messages, so it shares their keys
        return _chain(json.dumps([m.get("role"), m.get("content")] if isinstance(m, dict) else m,
                                 sort_keys=True, ensure_ascii=False).encode() for m in messages)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _chain(b.encode() for b in _blocks(prompt, CHARS_PER_BLOCK))
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return _chain(json.dumps(list(b)).encode() for b in _blocks(prompt, TOKENS_PER_BLOCK))
    return []


class PrefixOwners:
    """prefix hash -> the replica it was last routed to, bounded (least recently used forgotten)."""

    def __init__(self, capacity: int = MAX_REMEMBERED):
        self.capacity = capacity
        self._owner: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def longest(self, keys: Sequence[str], alive: Iterable[Any]) -> tuple[Any, int]:
        """The owner of the longest of ``keys`` whose owner is in ``alive``, and how many keys it matched."""
        alive = set(alive)
        for n in range(len(keys), 0, -1):
            owner = self._owner.get(keys[n - 1])
            if owner is not None and owner in alive:
                return owner, n
        return None, 0

    def record(self, keys: Sequence[str], owner: Any) -> None:
        for k in keys:
            self._owner[k] = owner
            self._owner.move_to_end(k)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def __len__(self) -> int:
        return len(self._owner)


def _router_base() -> type:
    try:
        from ray.serve.request_router import RequestRouter
    except ImportError:   # ray absent: the pure helpers above still import (and are unit tested)
        return object
    return RequestRouter


class PrefixAffinityRouter(_router_base()):   # type: ignore[misc]
    """A Ray Serve ``RequestRouter`` (alpha API, ray 2.60): prefix affinity, least loaded as the fallback.

    Configure with ``RequestRouterConfig(request_router_class=PrefixAffinityRouter,
    request_router_kwargs={"busy_threshold": n_slots})``. The request must carry its prefix hashes in the
    ``prefix_keys`` keyword argument (the ingress passes them).
    """

    def initialize_state(self, busy_threshold: int = 2, capacity: int = MAX_REMEMBERED, **kwargs: Any) -> None:
        self.busy_threshold = max(1, int(busy_threshold))
        self.owners = PrefixOwners(capacity)
        self.n_affine = self.n_fallback = 0

    def _load(self, replica: Any) -> int:
        # the cache counts what this router sent and what probes reported; unknown reads as idle, and
        # Serve probes it before sending anyway
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list, pending_request: Any = None) -> list[list]:
        if not candidate_replicas:
            return []
        by_load = sorted(candidate_replicas, key=self._load)
        keys = _keys_of(pending_request)
        by_id = {r.replica_id: r for r in candidate_replicas}
        owner_id, _ = self.owners.longest(keys, by_id) if keys else (None, 0)
        if owner_id is not None and self._load(by_id[owner_id]) < self.busy_threshold:
            self.n_affine += 1
            return [[by_id[owner_id]], [r for r in by_load if r.replica_id != owner_id]]
        self.n_fallback += 1
        # one rank: Serve takes the least loaded replica of it that accepts the request
        return [by_load]

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        keys = _keys_of(pending_request)
        if keys:
            self.owners.record(keys, replica_id)


def _keys_of(pending_request: Any) -> list[str]:
    if pending_request is None:
        return []
    keys = pending_request.kwargs.get(ROUTE_KWARG)
    return list(keys) if isinstance(keys, (list, tuple)) else []
