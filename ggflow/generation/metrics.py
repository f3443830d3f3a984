"""The engine's counters, under llama-server's /metrics names (without the ``llamacpp:`` prefix)."""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class MetricsSnapshot:
    prompt_tokens_total: int = 0          # evaluated prompt tokens (cached ones excluded)
    prompt_tokens_cached_total: int = 0
    prompt_tokens_shared_total: int = 0   # of those, reused from another slot's cells (prefix_cache.py)
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0           # summed over decode calls
    n_tokens_max: int = 0
    spec_decode_num_draft_tokens_total: int = 0      # speculative decoding: drafted tokens verified,
    spec_decode_num_accepted_tokens_total: int = 0   # accepted,
    spec_decode_num_drafts_total: int = 0            # and verification steps
    requests_processing: int = 0
    requests_deferred: int = 0
    kv_cache_tokens: int = 0
    kv_cache_size: int = 1
    n_evicted_total: int = 0              # requests ended to make room in a full shared KV cache

    @property
    def prompt_tokens_seconds(self) -> float:
        return self.prompt_tokens_total / self.prompt_seconds_total if self.prompt_seconds_total > 0 else 0.0

    @property
    def predicted_tokens_seconds(self) -> float:
        t = self.tokens_predicted_seconds_total
        return self.tokens_predicted_total / t if t > 0 else 0.0

    @property
    def n_busy_slots_per_decode(self) -> float:
        return self.n_busy_slots_total / max(self.n_decode_total, 1)

    @property
    def kv_cache_usage_ratio(self) -> float:
        return self.kv_cache_tokens / self.kv_cache_size


class EngineMetrics:
    """Written by the engine thread, read by request handlers: a lock keeps each read consistent."""

    def __init__(self, kv_cache_size: int):
        self._lock = threading.Lock()
        self._m = MetricsSnapshot(kv_cache_size=max(kv_cache_size, 1))

    def update(self, **deltas: float) -> None:
        with self._lock:
            for name, value in deltas.items():
                setattr(self._m, name, getattr(self._m, name) + value)

    def set(self, **values: float) -> None:
        with self._lock:
            for name, value in values.items():
                setattr(self._m, name, value)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(**asdict(self._m))
