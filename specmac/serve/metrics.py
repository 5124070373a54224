"""The server's Prometheus metrics (prometheus_client), in a registry of their own per app.

A registry per app, not the library's global one, so that two servers in one process (the tests)
do not collide, and /metrics shows only what specmac serve counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specmac_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("specmac_prompt_tokens", "Prompt tokens processed", registry=r)
        self.cached_tokens = Counter("specmac_cached_prompt_tokens",
                                     "Prompt tokens the caches already held (not processed again)",
                                     registry=r)
        self.store_bytes = Gauge("specmac_store_bytes", "Bytes of the saved sequences kept in memory",
                                 registry=r)
        self.store_entries = Gauge("specmac_store_entries", "Saved sequences kept in memory", registry=r)
        self.store_hits = Counter("specmac_store_hits", "Prompts that found their sequence in the store",
                                  registry=r)
        self.store_evictions = Counter("specmac_store_evictions",
                                       "Saved sequences evicted to stay within the memory budget", registry=r)
        self.ttft = Histogram("specmac_time_to_first_token_seconds",
                              "Time from a generation request's arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self._store_seen = {"hits": 0, "evictions": 0}
        self.generated = Counter("specmac_generated_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("specmac_drafted_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specmac_accepted_tokens", "Draft tokens accepted by the target", registry=r)
        self.passes = Counter("specmac_target_passes", "Target forward passes", registry=r)
        self.pred_accepted = Counter("specmac_prediction_accepted_tokens",
                                     "Prediction tokens accepted (Predicted Outputs)", registry=r)
        self.pred_rejected = Counter("specmac_prediction_rejected_tokens",
                                     "Prediction tokens proposed and not accepted", registry=r)
        self.cancelled = Counter("specmac_cancelled_requests", "Generations stopped by a client that left",
                                 registry=r)
        self.latency = Histogram("specmac_request_latency_seconds",
                                 "Time from a generation request's arrival to its last token",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("specmac_queue_depth", "Requests waiting for the worker", registry=r)
        self.busy = Gauge("specmac_worker_busy", "1 while the worker generates", registry=r)

    def record_run(self, usage: dict) -> None:
        """One finished (or cancelled) generation's usage object."""
        spec, details = usage["speculative"], usage["completion_tokens_details"]
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.cached_tokens.inc(usage["prompt_tokens_details"]["cached_tokens"])
        self.generated.inc(usage["completion_tokens"])
        self.drafted.inc(spec["drafted"])
        self.accepted.inc(spec["accepted"])
        self.passes.inc(spec["target_passes"])
        self.pred_accepted.inc(details["accepted_prediction_tokens"])
        self.pred_rejected.inc(details["rejected_prediction_tokens"])

    def record_store(self, info: dict) -> None:
        """The store after a generation (``SequenceStore.info``): its size now, hits and evictions since."""
        self.store_bytes.set(info["bytes"])
        self.store_entries.set(info["entries"])
        self.store_hits.inc(info["hits"] - self._store_seen["hits"])
        self.store_evictions.inc(info["evictions"] - self._store_seen["evictions"])
        self._store_seen = {k: info[k] for k in self._store_seen}

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
