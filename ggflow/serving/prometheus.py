"""The engine's metrics as Prometheus text, under llama-server's names (``llamacpp:*``)."""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ggflow.generation.metrics import MetricsSnapshot

# (name, help); a counter's exposed name gains "_total", as llama-server's counters have it
COUNTERS = (
    ("prompt_tokens", "Number of prompt tokens processed, excluding cached tokens", "prompt_tokens_total"),
    ("prompt_tokens_cached", "Number of prompt tokens reused from the cache", "prompt_tokens_cached_total"),
    ("prompt_tokens_shared", "Number of prompt tokens reused from another slot's cache", "prompt_tokens_shared_total"),
    ("prompt_seconds", "Total time spent processing prompts", "prompt_seconds_total"),
    ("tokens_predicted", "Number of generation tokens processed", "tokens_predicted_total"),
    ("tokens_predicted_seconds", "Total time spent generating tokens", "tokens_predicted_seconds_total"),
    ("n_decode", "Total number of decode calls", "n_decode_total"),
    ("spec_decode_num_draft_tokens", "Speculative: Total draft tokens generated", "spec_decode_num_draft_tokens_total"),
    ("spec_decode_num_accepted_tokens", "Speculative: Total draft tokens accepted by the target model",
     "spec_decode_num_accepted_tokens_total"),
    ("spec_decode_num_drafts", "Speculative: Total speculative decoding verification steps",
     "spec_decode_num_drafts_total"),
    ("requests_evicted", "Requests ended (finish_reason length, evicted) to make room in the full shared KV cache",
     "n_evicted_total"),
)
GAUGES = (
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per decode call"),
    ("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage"),
    ("kv_cache_tokens", "KV-cache tokens"),
)


class _EngineCollector:
    def __init__(self, read: Callable[[], MetricsSnapshot]):
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        m = self.read()
        for name, help_text, field in COUNTERS:
            yield CounterMetricFamily(f"llamacpp:{name}", help_text, value=float(getattr(m, field)))
        for name, help_text in GAUGES:
            yield GaugeMetricFamily(f"llamacpp:{name}", help_text, value=float(getattr(m, name)))


def metrics_text(read: Callable[[], MetricsSnapshot]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(read))
    return generate_latest(registry)
