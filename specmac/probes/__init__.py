"""Probes: measure what decides whether speculation pays on this machine, before a benchmark.

``parallelism`` times a batched ``score`` of n tokens against n one-token calls (and checks that
both give the same logits); ``latency`` times one-token passes of the draft and the target.
Both work on any ``BaseBackend``, entry-point plugins included. Pure numpy on top of the contract.
"""

from specmac.probes.latency import measure_latency, probe_tokens, time_single
from specmac.probes.parallelism import SerialBackend, probe_parallelism, verdict

__all__ = ["SerialBackend", "measure_latency", "probe_parallelism", "probe_tokens", "time_single",
           "verdict"]
