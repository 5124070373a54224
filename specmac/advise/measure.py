"""What advise measures, once per model variant: a target's pass T(n) and the loop's own cost per
step, a draft's one-token pass and its prefill of the prompts, and each one's logits on a reference
text the target wrote itself (teacher forcing). Acceptance follows from the logits alone
(``specmac.advise.predict``), so no speculative run is needed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specmac.advise.variants import Variant
from specmac.advise.workload import reference
from specmac.api import Pair
from specmac.backends import BaseBackend
from specmac.core.drafters import lookup
from specmac.core.lookup import LookupDrafter
from specmac.core.sampling import SamplingParams, warp
from specmac.tuning.calibration import pass_costs
from specmac.tuning.timing import Progress, time_single
from specmac.vocab import align_logits


def warp_cost_ms(n_logits: int, n_vocab: int, params: Any, n: int, repeats: int = 15) -> float:
    """Median ms the loop spends on n logit rows before the rule reads them: aligning them, then
    the argmax (greedy) or warping them into probabilities. For sampling an upper bound: the loop
    warps rows lazily, and rows past the first rejection are never warped."""
    x = np.random.default_rng(0).standard_normal((n, n_logits)).astype(np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = align_logits(x, n_vocab)
        np.argmax(rows, axis=-1) if params.greedy else warp(rows, params)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


@dataclass
class Probe:
    """What one variant costs and what it predicts on the reference text."""

    variant: Variant
    t_pass: list[float] = field(default_factory=list)  # seconds, T(n) for n = 1..; drafts: [T_d(1)]
    t_step: float = 0.0  # seconds the loop adds per step (targets)
    rows: list = field(default_factory=list)  # per text: argmax ids, warped probs or n-gram lookups
    # seconds a draft takes to prefill a prompt: the mean over the reference's (each prompt is one run,
    # so a workload's time is their sum, however their lengths differ)
    t_prefill: float = 0.0
    prefills: list[float] = field(default_factory=list)  # seconds per reference prompt (a model draft)
    t_feed: float = 0.0  # seconds per token a draft's batched pass takes (median of its prefills)
    lookup: list | None = None  # a hybrid: the lookup's proposals per text and position, beside ``rows``
    alone: Probe | None = None  # a hybrid: its lookup alone, which it is where its model would not pay
    seconds: float = 0.0  # what loading and probing this variant took (the reference text included)


def _rows(backend: BaseBackend, texts: list[list[int]], starts: list[int], params: SamplingParams,
          n_vocab: int, prefills: list[float] | None = None,
          progress: Progress | None = None) -> list[np.ndarray]:
    """Teacher forcing: per text, the distribution (sampled: warped probabilities, float32) or the
    argmax (greedy) at every position that predicts a reference token. The prompt is prefilled
    first, as a draft in the loop does it, and its seconds appended to ``prefills``. ``progress``
    hears of every text (in tokens)."""
    out = []
    total, done = sum(len(ids) for ids in texts), 0
    for i, (ids, start) in enumerate(zip(texts, starts)):
        if progress is not None:
            progress(f"reading the reference text, prompt {i + 1} of {len(texts)}", done, total)
        done += len(ids)
        backend.reset()
        t0 = time.perf_counter()
        last = np.asarray(backend.prefill(ids[:start]))
        if prefills is not None:
            prefills.append(time.perf_counter() - t0)
        rest = backend.score(ids[start:-1]) if len(ids) - 1 > start else np.empty((0, last.shape[-1]))
        logits = align_logits(np.vstack([last[None], np.asarray(rest)]), n_vocab)
        out.append(np.argmax(logits, axis=-1) if params.greedy else warp(logits, params).astype(np.float32))
    backend.reset()
    if progress is not None:
        progress("reading the reference text", total, total)
    return out


def reference_texts(target: BaseBackend, prompts: Sequence[str], params: SamplingParams, run_tokens: int,
                    seed: int) -> tuple[list[list[int]], list[int]]:
    """Prompt + the target's own continuation (the text the loop will verify), and where each
    continuation starts (``specmac.advise.workload.reference`` without its categories)."""
    ref = reference(target, prompts, params, run_tokens, seed)
    return ref.texts, ref.starts


def probe_target(v: Variant, backend: BaseBackend, k_max: int, params: SamplingParams, texts, starts,
                 n_vocab: int, t_pass: list[float] | None = None, progress: Progress | None = None) -> Probe:
    """A target's costs (``t_pass``: T(n) already measured, else timed here) and its rows;
    ``progress`` hears how far each is."""
    if t_pass is None:
        t_pass, _ = pass_costs(backend, None, k_max, repeats=3, progress=progress)
    plain = Pair(backend)
    if progress is not None:
        progress("timing the loop's own work", 0, 0)
    events = list(plain.stream(texts[0][: starts[0]], params=params, max_tokens=6, seed=0))[1:]
    # the loop's own work per step, timed apart from the pass: a step's time less the probe's
    # T(1) would also count the pass's drift between the two timings
    t_step = float(np.median([e.t_draft + e.t_other for e in events])) if events else 0.0
    return Probe(v, t_pass, t_step, _rows(backend, texts, starts, params, n_vocab, progress=progress))


def probe_draft(v: Variant, backend: BaseBackend | None, params: SamplingParams, texts, starts,
                n_vocab: int, k_max: int, progress: Progress | None = None) -> Probe:
    if backend is None:  # prompt lookup: what it would copy at each position of the reference
        t0 = time.perf_counter()
        rows = lookup_rows(v.backend, texts, starts, params, n_vocab, k_max)
        t = (time.perf_counter() - t0) / max(sum(len(r) for r in rows), 1)
        return Probe(v, [t], 0.0, rows)
    if progress is not None:
        progress("timing the draft's pass", 0, 0)
    t_d = time_single(backend, context=min(16, backend.n_ctx - 1), repeats=5, warmup=1)["median_ms"] / 1e3
    prefills: list[float] = []
    rows = _rows(backend, texts, starts, params, n_vocab, prefills, progress)
    feed = float(np.median([t / max(s, 1) for t, s in zip(prefills, starts)]))
    return Probe(v, [t_d], 0.0, rows, t_prefill=float(np.mean(prefills)), prefills=prefills, t_feed=feed)


def lookup_rows(name: str, texts, starts, params: SamplingParams, n_vocab: int, k_max: int) -> list[list]:
    """Per text and reference position, the proposal of a model-free drafter there: "ngram" (the
    last n-gram's latest earlier match) or "lookup" (``LookupDrafter``, walked along the text), the
    kinds of match it bets on without a planner's costs (a prior share of 1/2 or more) only."""
    if name == "ngram":
        return [[lookup(ids[:i], k_max) for i in range(start, len(ids))] for ids, start in zip(texts, starts)]
    out = []
    for ids, start in zip(texts, starts):
        drafter = LookupDrafter()
        proposals = (drafter.propose(ids[:i], k_max) for i in range(start, len(ids)))
        out.append([d if kind and drafter.priors[kind][0] >= 0.5 else [] for d, kind in proposals])
    return out


