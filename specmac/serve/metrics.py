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
        self.busy = Gauge("specmac_worker_busy", "Generations in progress (sharing each pass)", registry=r)
        self.steps = Counter("specmac_steps", "Steps taken, by the source that drafted them "
                             "(\"none\": a step without drafts)", ["source"], registry=r)
        self.step_drafts = Counter("specmac_step_draft_tokens", "Draft tokens verified, by source",
                                   ["source"], registry=r)
        self.step_accepted = Counter("specmac_step_accepted_tokens", "Draft tokens accepted, by source",
                                     ["source"], registry=r)
        self.batch = Histogram("specmac_batch_size", "Streams taking a step in each target pass",
                               buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=r)
        # the same counts under the names dashboards know: vLLM's speculative decoding and scheduler
        # metrics, llama.cpp server's decode counters
        self.v_drafts = Counter("vllm:spec_decode_num_drafts", "Steps that verified drafts", registry=r)
        self.v_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified",
                                      registry=r)
        self.v_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.v_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                 "Draft tokens accepted, by position in the draft", ["position"], registry=r)
        self.v_running = Gauge("vllm:num_requests_running", "Generations in progress", registry=r)
        self.v_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting in the queue", registry=r)
        self.v_ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token",
                                buckets=LATENCY_BUCKETS, registry=r)
        self.l_decode = Counter("llamacpp:n_decode", "Target passes (llama_decode calls in llama.cpp)",
                                registry=r)
        self.l_busy = Gauge("llamacpp:n_busy_slots_per_decode", "Streams per target pass, on average",
                            registry=r)
        self.l_prompt = Counter("llamacpp:prompt_tokens", "Prompt tokens processed", registry=r)
        self.l_predicted = Counter("llamacpp:tokens_predicted", "Tokens generated", registry=r)
        self._passes = self._stepping = 0

    def record_pass(self, n_stepping: int) -> None:
        """A target pass in which ``n_stepping`` streams took a step (others only read prompts)."""
        self.l_decode.inc()
        if n_stepping:
            self.batch.observe(n_stepping)
            self._passes += 1
            self._stepping += n_stepping
            self.l_busy.set(self._stepping / self._passes)

    def record_step(self, event) -> None:
        """One stream's step (a ``specmac.core.loop.Event``)."""
        self.steps.labels(source=event.source).inc()
        if event.n_drafted:
            self.v_drafts.inc()
            self.v_draft_tokens.inc(event.n_drafted)
            self.v_accepted.inc(event.n_accepted)
            self.step_drafts.labels(source=event.source).inc(event.n_drafted)
            self.step_accepted.labels(source=event.source).inc(event.n_accepted)
            for j in range(event.n_accepted):
                self.v_per_pos.labels(position=str(j)).inc()

    def record_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.v_ttft.observe(seconds)

    def record_queue(self, waiting: int, running: int) -> None:
        self.queue_depth.set(waiting)
        self.v_waiting.set(waiting)
        self.busy.set(running)
        self.v_running.set(running)

    def record_run(self, usage: dict) -> None:
        """One finished (or cancelled) generation's usage object."""
        spec, details = usage["speculative"], usage["completion_tokens_details"]
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.cached_tokens.inc(usage["prompt_tokens_details"]["cached_tokens"])
        self.l_prompt.inc(usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"])
        self.generated.inc(usage["completion_tokens"])
        self.l_predicted.inc(usage["completion_tokens"])
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
