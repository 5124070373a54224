"""The clock discipline over the backend contract, shared by the probes and ``k="auto"``.

A fixed prefill, warm-up calls, ``sync()`` before and after reading the clock, several repeats,
median and spread (interquartile range). Pure Python over ``BaseBackend``: no framework.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from specmac.backends import BaseBackend
from specmac.errors import BadOption

Progress = Callable[[str, float, float], None]
"""``progress(what, done, total)``: the job ``what`` has ``done`` of ``total`` done, in any unit of
like cost (seconds of work, say), so done / total is the share of its time gone; ``done`` 0 starts
it, ``done`` >= ``total`` ends it; ``total`` 0: how far is unknown. The caller renders it
(``specmac.cli.progress``); a measuring layer only reports."""

# code-like text: the embedded pair and the Qwen coder models are trained on code
PROBE_TEXT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
    "for i in range(10):\n    print(i, fibonacci(i))\n"
)


def labelled(progress: Progress | None, prefix: str) -> Progress | None:
    """``progress`` with ``prefix`` before the name of every job it hears of (None stays None)."""
    if progress is None:
        return None
    return lambda what, done, total: progress(f"{prefix}{what}", done, total)


def probe_tokens(backend: BaseBackend, n: int, text: str = PROBE_TEXT) -> list[int]:
    """n ordinary token ids from ``text`` (repeated as needed), with special ids left out."""
    ids = [t for t in backend.encode(text) if t not in backend.vocab.special_ids
           and t not in backend.vocab.eos_ids]
    if not ids:
        raise BadOption(f"the {backend.name} backend encodes the probe text to no ordinary tokens")
    return (ids * (n // len(ids) + 1))[:n]


def timed(backend: BaseBackend, fn: Callable[[], object]) -> float:
    """Seconds fn takes, with the backend synchronised before and after."""
    backend.sync()
    t0 = time.perf_counter()
    fn()
    backend.sync()
    return time.perf_counter() - t0


def summary(samples_s: Sequence[float]) -> dict:
    """Median, quartiles and interquartile range of timings, in milliseconds."""
    ms = np.asarray(samples_s) * 1e3
    q1, med, q3 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3), "iqr_ms": float(q3 - q1),
            "n": len(ms)}


def check_context(backend: BaseBackend, context: int, extra: int) -> None:
    """``context`` prefilled tokens plus ``extra`` probed ones must fit the context window."""
    if context < 1:
        raise BadOption(f"context {context} is out of range: use an integer >= 1", param="context")
    if context + extra > backend.n_ctx:
        raise BadOption(f"context {context} + {extra} probe tokens exceed the {backend.name} "
                        f"backend's context window of {backend.n_ctx}: lower context", param="context")


def time_single(backend: BaseBackend, *, context: int = 64, repeats: int = 10,
                warmup: int = 2) -> dict:
    """T(1): one-token score calls after a prefill of ``context`` tokens, rewound between calls."""
    check_context(backend, context, 1)
    ids = probe_tokens(backend, context + 1)
    backend.reset()
    backend.prefill(ids[:context])
    samples = []
    for i in range(warmup + repeats):
        backend.rewind(context)
        dt = timed(backend, lambda: backend.score(ids[context:]))
        if i >= warmup:
            samples.append(dt)
    backend.reset()
    return summary(samples)


def time_shared_drafting(lanes: Sequence, costs, *, context: int = 64, repeats: int = 8) -> None:
    """Each draft model among ``lanes``' sources (``Pair.lanes``) whose backend scores several
    lanes in one pass: its one-token pass drafting for two lanes and for all of them at once, after
    ``context`` tokens each, timed and told to ``costs`` (``Costs.observe_draft`` with the lanes);
    every draft lane left empty. Before any such pass is timed the planner prices drafting for
    several streams as a pass per stream, so where sharing is cheap it would decline the model for
    a batch and never time the pass that shows it; a server times it once at its start. Told as
    the ``repeats`` passes it timed (each at their median), not as one: a few passes slowed later
    (a neighbour's burst) must not outweigh them, for a price read too dear is never timed again."""
    if len(lanes) < 2:
        return
    for source in lanes[0].sources:
        lead = source.backend
        if lead is None or not lead.can_batch:
            continue
        backs = [next(s.backend for s in lane.sources if s.name == source.name) for lane in lanes]
        check_context(lead, context, 1)
        ids = probe_tokens(lead, context + 1)
        lead.score_many([(b, ids[:context], False) for b in backs])
        for m in sorted({2, len(backs)}):
            asks = [(b, ids[context:], True) for b in backs[:m]]
            samples = []
            for i in range(repeats + 1):  # the first pass warms up
                dt = timed(lead, lambda lead=lead, asks=asks: lead.score_many(asks))
                for b in backs[:m]:
                    b.rewind(context)
                if i:
                    samples.append(dt)
            costs.observe_draft(source.name, repeats, repeats * float(np.median(samples)), lanes=m)
        for b in backs:
            b.reset()
