"""What ``k="auto"`` measures before the first token: the costs its policy starts from.

A short probe times the target's pass at every width K can take and the draft's one-token pass
(milliseconds on the embedded pair, seconds on a 1.5B model), so the adaptive policy spends no
step exploring costs; acceptance is then learnt from the run. The costs are kept per machine,
target, draft and options (``cached_pass_costs``), so only a pair's first run pays the probe. Part
of the API layer: ``Pair`` resolves ``k="auto"`` with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from specmac.backends import BaseBackend
from specmac.backends.conversion.cache import signature
from specmac.core.policy import AdaptiveK
from specmac.core.timing import probe_tokens, time_single, timed
from specmac.errors import SpecmacError
from specmac.files import cache_home, write_json


def pass_costs(target: BaseBackend, draft: BaseBackend | None, k_max: int,
               context: int = 16, repeats: int = 1) -> tuple[list[float], float]:
    """(T_t(n) for n = 1..k_max + 1, T_d(1)), seconds; T_d(1) is 0 without a draft model.

    Every width is timed: llama.cpp switches kernels with the batch size, so T(n) has dips
    that interpolation would miss (results/probes). The first two timings
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


def costs_dir() -> Path:
    """Where measured pass costs are kept: $SPECMAC_CACHE/calibration, else ~/.cache/specmac/calibration."""
    return cache_home() / "calibration"


def _identity(backend: BaseBackend | None) -> dict | None:
    """What a pass's cost depends on: backend, model (and its files' size and mtime), options."""
    if backend is None:
        return None
    info = {k: v for k, v in backend.info().items() if k != "vocab"}
    model = Path(str(info.get("model") or ""))
    if model.exists():
        info["file"] = signature(model)
    return info


def cached_pass_costs(target: BaseBackend, draft: BaseBackend | None,
                      k_max: int) -> tuple[list[float], float, bool]:
    """``pass_costs`` for this machine, target and draft, measured once and kept (``costs_dir``):
    (T_t(n), T_d(1), whether they came from the cache). The probe costs seconds on a real model
    (results/anatomy_auto, bench/calibration_cost.py), which every ``k="auto"`` run would otherwise
    pay before its first token. Each run's steps refine its own copy, as they refine a fresh probe's; the kept
    file is not rewritten. A missing, unreadable or malformed entry is measured again; one that
    cannot be written is only not kept. Delete the folder to re-measure (say after a change of
    hardware or of load)."""
    ident = {"target": _identity(target), "draft": _identity(draft), "k_max": k_max,
             "host": platform.node(), "cpus": os.cpu_count()}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = costs_dir() / f"{key}.json"
    try:
        kept = json.loads(path.read_text())
        t_target, t_draft = [float(x) for x in kept["t_target"]], float(kept["t_draft"])
        if len(t_target) == k_max + 1 and min(t_target) > 0 and t_draft >= 0:
            return t_target, t_draft, True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    t_target, t_draft = pass_costs(target, draft, k_max)
    try:
        write_json(path, {"t_target": t_target, "t_draft": t_draft, "measured": time.time(),
                          "identity": ident})
    except OSError:
        pass
    return t_target, t_draft, False


def adaptive_policy(target: BaseBackend, draft: BaseBackend | None, *, calibrate: bool = True,
                    cache: bool = True, **kw) -> AdaptiveK:
    """An AdaptiveK for this target and draft, started from measured costs (``calibrate``; kept
    between runs with ``cache``, see ``cached_pass_costs``). A pair whose context window is too
    small to probe starts uncalibrated and explores instead."""
    policy = AdaptiveK(**kw)
    if calibrate:
        t0 = time.perf_counter()
        try:
            if cache:
                t_target, t_draft, policy.calibration_cached = cached_pass_costs(target, draft, policy.k_max)
            else:
                t_target, t_draft = pass_costs(target, draft, policy.k_max)
        except SpecmacError:  # e.g. a context window too small to probe
            return policy
        policy.set_costs(t_target, t_draft)
        policy.calibration_s = time.perf_counter() - t0
    return policy
