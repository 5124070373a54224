"""What ``k="auto"`` measures before the first token: the costs its policy starts from.

A short probe times the target's pass at every width K can take and the draft's one-token pass
(milliseconds on the embedded pair, seconds on a 1.5B model), so the adaptive policy spends no
step exploring costs; acceptance is then learnt from the run. Part of the API layer: ``Pair``
resolves ``k="auto"`` with it.
"""

from __future__ import annotations

import time

import numpy as np

from specmac.backends import BaseBackend
from specmac.errors import SpecmacError
from specmac.policy import AdaptiveK
from specmac.timing import probe_tokens, time_single, timed


def pass_costs(target: BaseBackend, draft: BaseBackend | None, k_max: int,
               context: int = 16, repeats: int = 1) -> tuple[list[float], float]:
    """(T_t(n) for n = 1..k_max + 1, T_d(1)), seconds; T_d(1) is 0 without a draft model.

    Every width is timed: llama.cpp switches kernels with the batch size, so T(n) has dips
    (T(16) < T(13) on a 1.5B Q4_K_M here) that interpolation would miss. The first two timings
    warm buffers and kernels up; T(1), every S(K)'s yardstick, is the median of three (or of
    ``repeats`` + 2), every other width the median of ``repeats`` sweeps (1 before ``k="auto"``'s
    first token, where the run's own steps refine the curve; advise, which has no run, takes 3 so
    that one preempted pass does not make a width look slow).
    """
    if repeats < 1:
        raise ValueError(f"repeats {repeats} is out of range: use 1 or more")
    widths = list(range(1, k_max + 2))
    ids = probe_tokens(target, context + widths[-1])
    try:
        target.reset()
        target.prefill(ids[:context])
        times: dict[int, list[float]] = {}
        for n in (widths[-1], 1, *widths * repeats, 1, 1):
            target.rewind(context)
            times.setdefault(n, []).append(timed(target, lambda n=n: target.score(ids[context:context + n])))
    finally:
        target.reset()
    t_draft = time_single(draft, context=context, repeats=3, warmup=1)["median_ms"] / 1e3 if draft else 0.0
    return ([float(np.median(times[1][-(repeats + 2):]))] +
            [float(np.median(times[w][-repeats:])) for w in widths[1:]], t_draft)


def adaptive_policy(target: BaseBackend, draft: BaseBackend | None, *, calibrate: bool = True,
                    **kw) -> AdaptiveK:
    """An AdaptiveK for this target and draft, started from measured costs (``calibrate``). A pair
    whose context window is too small to probe starts uncalibrated and explores instead."""
    policy = AdaptiveK(**kw)
    if calibrate:
        t0 = time.perf_counter()
        try:
            t_target, t_draft = pass_costs(target, draft, policy.k_max)
        except SpecmacError:  # e.g. a context window too small to probe
            return policy
        policy.set_costs(t_target, t_draft)
        policy.calibration_s = time.perf_counter() - t0
    return policy
