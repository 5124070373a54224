"""advise: measure what decides whether speculation pays for one pairing, then predict S(K).

Measurement layer: short runs of the loop (acceptance, the loop's own costs), the parallelism
probe of the target, the draft's one-token pass; the prediction itself is ``specmac.core.costs``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from specmac.api import Pair
from specmac.core.costs import K_MAX, acceptance_from_stats, speedup_table, why_not
from specmac.core.prompts import advise_prompts
from specmac.core.runstats import RunStats
from specmac.core.sampling import SamplingParams, warp
from specmac.core.timing import check_context, time_single
from specmac.errors import BadOption
from specmac.probes import probe_parallelism
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


def _loop_costs(pair: Pair, prompts: Sequence[Any], params: Any, run_tokens: int, k: int, seed: int):
    """Short runs of ``run_tokens`` per prompt at K = k (k = 0: target only). -> RunStats over all
    of them and the loop's own costs in ms: per draft pass (a step makes n_drafted passes, one more
    after a fully accepted step: the catch-up), per step outside the passes, and per emitted token
    overall (each run's first step is left out: its draft time includes the prompt's prefill)."""
    runner = pair if k else pair.baseline()
    stats = RunStats(k=k)
    draft_s = other_s = total_s = 0.0
    drafted = steps = tokens = 0
    for prompt in prompts:
        caught_up = False  # did the previous step accept all its drafts?
        for i, event in enumerate(runner.stream(prompt, params=params, max_tokens=run_tokens,
                                                k=max(k, 1), seed=seed)):
            stats.add(event)
            if i and event.tokens:
                draft_s, drafted = draft_s + event.t_draft, drafted + event.n_drafted + caught_up
                other_s, steps = other_s + event.t_other, steps + 1
                total_s += event.t_draft + event.t_verify + event.t_other
                tokens += len(event.tokens)
            caught_up = 0 < event.n_drafted == event.n_accepted
    loop = {"draft_ms_per_pass": 1e3 * draft_s / drafted if drafted else None,
            "other_ms_per_step": 1e3 * other_s / steps if steps else None,
            "ms_per_token": 1e3 * total_s / tokens if tokens else None}
    return stats, loop


def advise(pair: Pair, *, params: SamplingParams, prompts: str | Sequence[str | Sequence[int]] | None = None,
           run_tokens: int = 48, run_k: int = 8, k_max: int = K_MAX, context: int = 128,
           repeats: int = 3, seed: int = 0) -> dict:
    """Measure T_draft(1), the target's T(n) curve and acceptance (short speculative runs of
    ``run_tokens`` per prompt at K = ``run_k``), then predict S(K) for K = 1..k_max.

    ``prompts`` is one prompt (text or token ids) or several; None gives ``advise_prompts()``.
    Acceptance differs a lot between texts (code that repeats its prompt vs free prose), so it is
    pooled over several.

    Costs are what the loop pays: the draft's cost per pass (its pass plus sampling, as measured in
    the run; at least the bare pass T_draft(1)), K passes a step plus a catch-up pass after a fully
    accepted step (``draft_passes``); per speculative step over n tokens
    the measured T_t(n) plus the loop's overhead o(n) (turning n rows into probabilities, timed
    on the spot, plus the fixed rest measured in the run); and per token of target-only decoding
    what a short target-only run of the loop measures (T_t(1) and its lighter overhead), which is
    the curve's n = 1 entry, the numerator of S(K).

    Returns best_k, predicted_speedup, alpha, alpha_profile, c, beta, verdict, t_draft_ms,
    t_target_ms, table (per K: k, tokens_per_pass, step_ms, predicted_speedup), reasons (why
    speculation will not pay; empty when it will) and the probe record.
    """
    if not pair.speculative:
        raise BadOption("draft 'none' cannot be advised on: advise needs a draft model or ngram",
                        param="draft")
    if prompts is None:
        prompts = advise_prompts()
    elif isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], (int, np.integer))):
        prompts = [prompts]  # one prompt: text or token ids
    if not prompts:
        raise BadOption("prompts is empty: advise needs at least one prompt to measure acceptance on",
                        param="prompts")
    n_max = k_max + 1
    check_context(pair.target, context, n_max)  # refused before anything is measured, never clamped
    if pair.drafter.backend is not None:
        check_context(pair.drafter.backend, context, 1)
    stats, loop = _loop_costs(pair, prompts, params, run_tokens, run_k, seed)
    alpha, profile = acceptance_from_stats(stats)
    _, base = _loop_costs(pair, prompts, params, run_tokens, 0, seed)
    target = pair.target
    probe = probe_parallelism(target, n_max=n_max, context=context, repeats=repeats)
    t_pass = None
    d = pair.drafter.backend
    if d is not None:
        t_pass = time_single(d, context=context, repeats=10)["median_ms"]
    t_draft = max(x for x in (loop["draft_ms_per_pass"], t_pass, 0.0) if x is not None)
    V, W = target.vocab.size, target.vocab.n_logits or target.vocab.size
    w1, wn = warp_cost_ms(W, V, params, 1), warp_cost_ms(W, V, params, n_max)
    w_row = max(wn - w1, 0.0) / (n_max - 1)
    fixed = max((loop["other_ms_per_step"] or 0.0) - (w1 + w_row * run_k), 0.0)
    t_curve = probe["batched_ms"]
    step = [t + fixed + w1 + w_row * (n - 1) for n, t in enumerate(t_curve, start=1)]  # T_t(n) + o(n)
    step[0] = base["ms_per_token"] or step[0]  # what target-only decoding pays per token
    table = speedup_table(profile, t_draft, step, k_max, catch_up=True)
    best = max(table, key=lambda r: r["predicted_speedup"])
    return {
        "best_k": best["k"], "predicted_speedup": best["predicted_speedup"],
        "alpha": alpha, "alpha_profile": profile, "c": t_draft / step[0],
        "beta": probe["beta"], "verdict": probe["verdict"],
        "t_draft_ms": t_draft, "t_draft_pass_ms": t_pass, "t_target_ms": t_curve[0],
        "target_only_ms_per_token": step[0],
        "target_curve_ms": t_curve, "loop_overhead_ms": [s - t for s, t in zip(step, t_curve)],
        "table": table,
        "reasons": why_not(profile, t_draft, step, probe["beta"], k_max, catch_up=True),
        "acceptance_run": {"k": run_k, "prompts": len(prompts), "n_tokens": stats.n_tokens,
                           "n_drafted": stats.n_drafted, "n_accepted": stats.n_accepted,
                           "per_position_acceptance": stats.per_position_acceptance, **loop},
        "target_only_run": base,
        "probe": probe,
        **pair.info(),
    }
