"""Probes: what decides whether speculation pays on this machine, measured before a benchmark.

``parallelism`` times a batched ``score`` of n tokens against n one-token calls (and checks that
both give the same logits) on any ``BaseBackend``, entry-point plugins included.
"""

from specmac.probes.parallelism import SerialBackend, probe_parallelism, verdict

__all__ = ["SerialBackend", "probe_parallelism", "verdict"]
