"""Does this backend really verify n tokens in one parallel pass? Batched vs serial ``score``.

After a fixed prefill of ``context`` tokens, for n = 1..n_max: the time of one ``score`` of n
tokens (rewound between trials), against n one-token ``score`` calls. The serial time for every n
comes from one run of n_max one-token calls (the time of the first n calls is exactly "n serial
calls after the context"), so the probe costs ~3x fewer passes than timing each n apart.

Fit: T(n) = T1 * (1 + beta * (n - 1)) on the batched medians. beta is the extra cost of each
extra token as a fraction of a one-token pass: 0 = the pass is free to widen, 1 = it costs as
much as separate passes (serial). Verdict thresholds (``costs.BETA_PARALLEL/SERIAL``):

* beta < 0.25, **parallel**: verifying K + 1 = 5 tokens costs at most 2 one-token passes, so a
  good draft can still give a speedup of up to (K + 1) / (1 + beta K) -> 1/beta = 4x and more.
* 0.25 <= beta < 0.75, **partly serial**: speculation can pay only with a very cheap draft and
  high acceptance; the bound above, 1/beta, lies between 4/3 and 4.
* beta >= 0.75, **serial**: even a free draft accepted every time gains < (K + 1) / (1 + 0.75 K)
  < 4/3, which the draft's own cost and rejections eat: speculation will not pay.

The numerical side: batched and serial logits of the same tokens differ by round-off (different
kernels / reduction orders); in low precision that flips the argmax now and then, which is why
greedy speculative output can differ from plain greedy. Reported as max |delta logit| and the
number of rows whose argmax differs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from specmac.backends import BaseBackend
from specmac.core.costs import BETA_PARALLEL, BETA_SERIAL, fit_beta
from specmac.errors import BadOption
from specmac.tuning.timing import check_context, probe_tokens, summary, timed

NOISY = 0.15  # timings whose IQR is above this fraction of the median are not to be trusted


def verdict(beta: float) -> str:
    """parallel (beta < 0.25), partly serial (< 0.75) or serial; see the module docstring."""
    if beta < BETA_PARALLEL:
        return "parallel"
    return "partly serial" if beta < BETA_SERIAL else "serial"


class SerialBackend(BaseBackend):
    """The serial control: wraps any backend so that ``score`` of n tokens runs n one-token calls.

    A probe that cannot call this serial cannot see the effect it claims to measure. ``prefill``
    is passed through batched (it is set-up, not the verification pass being probed).
    """

    def __init__(self, inner: BaseBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.library = inner.library
        self.vocab, self.n_ctx = inner.vocab, inner.n_ctx
        self.model_id = inner.model_id
        self.resolved = dict(getattr(inner, "resolved", {}))

    @property
    def n_past(self) -> int:
        return self.inner.n_past

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        return np.concatenate([self.inner.score([t]) for t in tokens])

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        return self.inner.prefill(tokens)

    def rewind(self, n_past: int) -> None:
        self.inner.rewind(n_past)

    def reset(self) -> None:
        self.inner.reset()

    def sync(self) -> None:
        self.inner.sync()

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def info(self) -> dict:
        return {**self.inner.info(), "serial_control": True}


def _warm_up(b: BaseBackend, context: int, toks: list[int]) -> None:
    """The widest batched pass and a few one-token passes: buffers, kernels and caches get ready
    at a fraction of a full repeat's cost (which matters on a large model)."""
    for n in (len(toks), 1, 1, 2):
        b.rewind(context)
        b.score(toks[:n])
    b.sync()


def _one_repeat(b: BaseBackend, context: int, toks: list[int], order: Sequence[int]
                ) -> tuple[dict[int, float], list[float], dict[int, np.ndarray], np.ndarray]:
    """Batched time per n, one-token call times, and the logits of both (for the numerics)."""
    batched_t, batched_logits = {}, {}
    for n in order:
        b.rewind(context)
        out: list[np.ndarray] = []
        batched_t[n] = timed(b, lambda n=n, out=out: out.append(b.score(toks[:n])))
        batched_logits[n] = out[0]
    b.rewind(context)
    serial_t, rows = [], []
    for t in toks:
        serial_t.append(timed(b, lambda t=t: rows.append(b.score([t]))))
    return batched_t, serial_t, batched_logits, np.concatenate(rows)


def _numerics(batched: dict[int, np.ndarray], serial: np.ndarray, n_vocab: int) -> dict:
    """max |delta logit| and argmax flips over every batched row vs the serial row of that token."""
    diff, flips, rows = 0.0, 0, 0
    for n, logits in batched.items():
        a = logits[:, :n_vocab].astype(np.float64)
        s = serial[:n, :n_vocab].astype(np.float64)
        diff = max(diff, float(np.max(np.abs(a - s))))
        flips += int(np.sum(a.argmax(-1) != s.argmax(-1)))
        rows += n
    return {"max_abs_logit_diff": diff, "argmax_flips": flips, "rows_compared": rows}


def probe_parallelism(backend: BaseBackend, *, n_max: int = 16, context: int = 256,
                      repeats: int = 3, warmup: int = 1) -> dict:
    """Time batched vs serial scoring for n = 1..n_max and fit beta; see the module docstring.

    Returns the probe record: backend, model, n, batched_ms, serial_ms (medians), their
    interquartile ranges, ideal_ms, t1_ms, beta, verdict, beta_serial (the fit of the serial
    curve, ~1 by construction: the probe's check on itself), max_abs_logit_diff, argmax_flips.
    """
    if not 1 <= n_max <= 256:
        raise BadOption(f"n_max {n_max} is out of range: use 1..256", param="n_max")
    if repeats < 1:
        raise BadOption(f"repeats {repeats} is out of range: use an integer >= 1", param="repeats")
    if warmup < 0:
        raise BadOption(f"warmup {warmup} is out of range: use an integer >= 0", param="warmup")
    check_context(backend, context, n_max)
    ids = probe_tokens(backend, context + n_max)
    toks, ns = ids[context:], list(range(1, n_max + 1))
    t0 = time.perf_counter()
    backend.reset()
    backend.prefill(ids[:context])
    batched: dict[int, list[float]] = {n: [] for n in ns}
    calls: list[list[float]] = []  # per repeat, the time of each one-token call
    numerics = None
    try:
        for _ in range(warmup):
            _warm_up(backend, context, toks)
        for r in range(repeats):
            order = ns if r % 2 == 0 else ns[::-1]  # alternate so a slow drift biases no end
            bt, st, bl, sl = _one_repeat(backend, context, toks, order)
            for n in ns:
                batched[n].append(bt[n])
            calls.append(st)
            if numerics is None:
                numerics = _numerics(bl, sl, backend.vocab.size)
    finally:
        backend.reset()
    return _record(backend, ns, batched, np.array(calls), numerics, context=context, repeats=repeats,
                   warmup=warmup, seconds=time.perf_counter() - t0)


def _record(backend: BaseBackend, ns: list[int], batched: dict, calls: np.ndarray, numerics: dict | None,
            **meta) -> dict:
    """calls: [repeats, n_max] seconds of each one-token call. serial_ms(n) sums the per-call
    medians of the first n calls (one preempted call must not shift every larger n); its spread
    is the IQR of the per-repeat sums."""
    bs = [summary(batched[n]) for n in ns]
    ss = [summary(np.cumsum(calls, axis=1)[:, n - 1]) for n in ns]
    serial_med = list(np.cumsum(np.median(calls, axis=0)) * 1e3)
    for s, med in zip(ss, serial_med):
        s["median_ms"] = float(med)
    b_med = [s["median_ms"] for s in bs]
    t1, beta = fit_beta(ns, b_med)
    _, beta_serial = fit_beta(ns, serial_med)
    info = backend.info()
    rel_spread = float(np.median([s["iqr_ms"] / s["median_ms"] for s in bs + ss if s["median_ms"] > 0]))
    return {
        "backend": backend.name,
        "model": info.get("model") or getattr(backend, "model_id", ""),
        "serial_control": isinstance(backend, SerialBackend),
        "n": ns,
        "batched_ms": b_med,
        "batched_iqr_ms": [s["iqr_ms"] for s in bs],
        "batched_quartiles_ms": [[s["q1_ms"], s["q3_ms"]] for s in bs],
        "serial_ms": [s["median_ms"] for s in ss],
        "serial_iqr_ms": [s["iqr_ms"] for s in ss],
        "serial_quartiles_ms": [[s["q1_ms"], s["q3_ms"]] for s in ss],
        "ideal_ms": [b_med[0]] * len(ns),
        "t1_ms": t1,
        "beta": beta,
        "beta_serial": beta_serial,
        "beta_per_n": [None] + [(b / t1 - 1.0) / (n - 1) if t1 > 0 else None
                                for n, b in zip(ns[1:], b_med[1:])],
        "verdict": verdict(beta),
        "thresholds": {"parallel_below": BETA_PARALLEL, "serial_from": BETA_SERIAL},
        "relative_spread": rel_spread,  # median IQR / median: > NOISY means a busy machine
        **(numerics or {}),
        **meta,
        "backend_info": info,
    }
