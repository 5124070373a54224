"""Probes: measure what decides whether speculation pays on this machine, before a benchmark.

``parallelism`` times a batched ``score`` of n tokens against n one-token calls (and checks that
both give the same logits); ``time_single`` (specmac.timing) times one-token passes. Both work on
any ``BaseBackend``, entry-point plugins included. Pure numpy on top of the contract.
"""

from specmac.probes.parallelism import SerialBackend, probe_parallelism, verdict
from specmac.timing import probe_tokens, time_single

__all__ = ["SerialBackend", "probe_parallelism", "probe_tokens", "time_single", "verdict"]
