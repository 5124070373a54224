"""What ``k="auto"`` measures before the first token: the costs its policy starts from.

A short probe times the target's pass at every width K can take and the draft's one-token pass
(milliseconds on the embedded pair, seconds on a 1.5B model), so the adaptive policy spends no
step exploring costs; acceptance is then learnt from the run. The costs are kept per machine,
target, draft and options (``cached_pass_costs``), so only a pair's first run pays the probe, and
the target's curve, timed in three sweeps, once per machine and target for every draft in front of
it (``kept_curve``), so a lookup, a model draft and a hybrid start from the same costs. Part
of the API layer: ``Pair`` resolves ``k="auto"`` with it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specmac.backends import BaseBackend
from specmac.backends.conversion.cache import signature
from specmac.core.policy import AdaptiveK
from specmac.core.thread_curves import anchor_widths, derive_curve, sibling_curve
from specmac.core.timing import probe_tokens, time_single, timed
from specmac.errors import SpecmacError
from specmac.files import cache_home, write_json


def pass_costs(target: BaseBackend, draft: BaseBackend | None, k_max: int,
               context: int = 16, repeats: int = 1) -> tuple[list[float], float]:
    """(T_t(n) for n = 1..k_max + 1, T_d(1)), seconds; T_d(1) is 0 without a draft model.

    Every width is timed: llama.cpp switches kernels with the batch size, so T(n) has dips
    that interpolation would miss (results/probes). The first two timings
    warm buffers and kernels up; T(1), every S(K)'s yardstick, is the median of three (or of
    ``repeats`` + 2), every other width the median of ``repeats`` sweeps: 3 where the costs are
    kept for later runs (``kept_pass_costs``) and by advise, which has no run, so that one
    preempted pass does not make a width look slow or fast for every run after; 1 where they are
    measured for one run only (``cache=False``), whose own steps refine the curve.
    """
    costs = sweep_costs(target, list(range(1, k_max + 2)), repeats, context)
    return list(costs.values()), draft_pass(draft, context)


def sweep_costs(target: BaseBackend, widths: list[int], repeats: int = 1,
                context: int = 16) -> dict[int, float]:
    """{n: T_t(n)} for the ascending ``widths`` (1 first), seconds, timed as ``pass_costs`` times
    them: a warm-up pass at the widest and at one token, then ``repeats`` sweeps; T(1) the median
    of ``repeats`` + 2, every other width of ``repeats``."""
    if repeats < 1:
        raise ValueError(f"repeats {repeats} is out of range: use 1 or more")
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
    return {n: float(np.median(times[n][-(repeats + 2 if n == 1 else repeats):])) for n in widths}


def draft_pass(draft: BaseBackend | None, context: int = 16) -> float:
    """T_d(1), seconds: the median of three one-token passes of the draft (0 without a draft model)."""
    return time_single(draft, context=context, repeats=3, warmup=1)["median_ms"] / 1e3 if draft else 0.0


def prefill_per_token(backend: BaseBackend, n: int = 32) -> float:
    """Seconds per token of the backend's prefill of n tokens (the better of two, after a warm-up
    pass): what it pays to catch up on a prompt it has not seen, per token."""
    n = max(1, min(n, backend.n_ctx - 1))
    ids = probe_tokens(backend, n)
    try:
        backend.reset()
        backend.prefill(ids[:2])
        times = []
        for _ in range(2):
            backend.reset()
            times.append(timed(backend, lambda: backend.prefill(ids)))
    finally:
        backend.reset()
    return min(times) / n


def cached_prefill_per_token(backend: BaseBackend) -> float:
    """``prefill_per_token``, measured once per machine and model (kept beside the pass costs)."""
    ident = {"draft": _identity(backend), "host": platform.node(), "cpus": os.cpu_count(), "n": 32}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = costs_dir() / f"prefill-{key}.json"
    try:
        kept = float(json.loads(path.read_text())["per_token"])
        if math.isfinite(kept) and kept > 0 and not remeasure_asked():  # NaN, Inf, <= 0: measured again
            return kept
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rate = prefill_per_token(backend)
    try:
        write_json(path, {"per_token": rate, "measured": time.time(), "identity": ident})
    except OSError:
        pass
    return rate


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


# sweeps of every width in a measurement that is kept: one sweep's T(n)/T(1) was off by 10-25% at some
# widths on the 1.5B F16 and Q4_K_M targets (kept entries of bench/workloads.py runs against
# results/probes_wide), and a kept curve steers every later run's K
KEPT_REPEATS = 3
PLAUSIBLE = 3.0  # a kept T(1) within this factor of a fresh one-token pass (either way) is believed
DISAGREE = 3.0  # the run's own passes at one width this far from the kept cost (either way): dropped
MIN_SEEN = 4  # passes at a width before the run's median is set against the kept cost
FLOOR_S = 2e-4  # differences below this are timer noise on a tiny model, never a reason to re-measure


@dataclass
class Costs:
    """Pass costs for ``k="auto"`` and what became of the kept entry (``note``, for the run's stats)."""

    t_target: list[float]
    t_draft: float
    cached: bool
    note: str
    path: Path | None = None  # the kept entry these costs are (or would have been) kept in
    curve_path: Path | None = None  # the target's kept curve, which every draft's entry is made from


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def _x(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def remeasure_asked() -> bool:
    """SPECMAC_REMEASURE=1 (``specmac run --remeasure`` sets it): measure even where costs are kept."""
    return os.environ.get("SPECMAC_REMEASURE", "").strip().lower() in ("1", "true", "yes", "on")


def fresh_t1(target: BaseBackend, context: int = 1) -> float:
    """One one-token pass timed now, seconds: what a kept T(1) is checked against. Where the
    target holds a context (an earlier run's, whose passes paged the weights in) the pass follows
    it and is rewound: it costs one pass. Otherwise it follows a prefill of ``context`` tokens,
    which pages the weights in, and the target is left empty: one pass more. Every ``k="auto"`` run
    pays it before its first token; it was a prefill of 8 tokens and a pass on every run until
    2026-12-03, 221-290 ms on the 1.5B Q4_K_M file here (results/anatomy_auto)."""
    ids = probe_tokens(target, context + 1)
    held = target.n_past
    if 0 < held < target.n_ctx:
        try:
            return timed(target, lambda: target.score(ids[:1]))
        finally:
            target.rewind(held)
    try:
        target.reset()
        target.prefill(ids[:context])
        return timed(target, lambda: target.score(ids[context:context + 1]))
    finally:
        target.reset()


def _read_kept(path: Path, k_max: int) -> tuple[list[float], float] | str:
    """The kept entry's (T_t(n), T_d(1)), or why it cannot be used."""
    try:
        kept = json.loads(path.read_text("utf-8"))
        t_target, t_draft = [float(x) for x in kept["t_target"]], float(kept["t_draft"])
    except (FileNotFoundError, NotADirectoryError):  # none kept (where the cache cannot be, either)
        return ""
    except OSError as e:
        return f"the kept entry cannot be read ({e.strerror})"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "the kept entry is malformed"
    if len(t_target) != k_max + 1:
        return f"the kept entry has {len(t_target)} widths, not {k_max + 1}"
    bad = next((x for x in [*t_target, t_draft] if not math.isfinite(x)), None)
    if bad is not None or min(t_target) <= 0 or t_draft < 0:
        return f"the kept entry holds {bad if bad is not None else min(min(t_target), t_draft)} s, not a " \
               "finite positive time"
    return t_target, t_draft


def _believed(kept_t1: float, now: float) -> bool:
    """Is a kept T(1) within ``PLAUSIBLE`` of a fresh one-token pass (or within timer noise of it)?"""
    ratio = kept_t1 / now
    return 1 / PLAUSIBLE <= ratio <= PLAUSIBLE or abs(kept_t1 - now) <= FLOOR_S


def _key(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _curve_entry(target: BaseBackend) -> tuple[dict, Path]:
    """(what the target's curve depends on, where it is kept)."""
    ident = {"target": _identity(target), "host": platform.node(), "cpus": os.cpu_count()}
    return ident, costs_dir() / f"curve-{_key(ident)}.json"


def kept_curve(target: BaseBackend, k_max: int, remeasure: bool = False) -> tuple[list[float], Path, str]:
    """(T_t(n) for n = 1..k_max + 1, where it is kept, "" or how it was come by this time): the
    target's curve, measured in ``KEPT_REPEATS`` sweeps once per machine and target and shared by
    every draft's entry, so a lookup, a model draft and a hybrid in front of one target start from
    the same costs (and the probe is paid once). A kept curve narrower than k_max + 1 is measured
    again at the wider width; one whose T(1) is not within ``PLAUSIBLE`` of a fresh pass, too.
    Where none is kept for the target's thread count but one is for another count (the thread fit
    chose fewer threads on a busy machine), the curve is derived from that one (``derive_curve``)."""
    ident, path = _curve_entry(target)
    width, why = k_max, ""
    if not remeasure:
        try:
            kept = [float(x) for x in json.loads(path.read_text("utf-8"))["t_target"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            kept = []
        if kept and all(math.isfinite(x) and x > 0 for x in kept):
            width = max(k_max, len(kept) - 1)  # measured again, it stays as wide as it was
            if len(kept) >= k_max + 1:
                now = fresh_t1(target)
                if _believed(kept[0], now):
                    return kept[:k_max + 1], path, ""
                why = (f"the kept curve's T(1) {_ms(kept[0])} is {_x(kept[0] / now)} a fresh one-token pass "
                       f"({_ms(now)})")
        elif not path.exists():
            derived = _derived_curve(target, ident, path, width)
            if derived is not None:
                return derived[0][:k_max + 1], path, derived[1]
    curve, _ = pass_costs(target, None, width, repeats=KEPT_REPEATS)
    try:
        write_json(path, {"t_target": curve, "measured": time.time(), "identity": ident})
    except OSError:
        pass  # the pair's entry says whether the cache can be written
    return curve[:k_max + 1], path, f"the target's curve re-measured because {why}" if why else ""


def _derived_curve(target: BaseBackend, ident: dict, path: Path,
                   width: int) -> tuple[list[float], str] | None:
    """(the curve derived from a sibling's and a few fresh widths, kept at ``path``; how), or None
    where no curve of the target at another thread count is kept wide enough."""
    sibling = sibling_curve(costs_dir(), ident, width + 1)
    if sibling is None:
        return None
    (other, threads), fresh = sibling, sweep_costs(target, anchor_widths(width), repeats=2)
    curve = derive_curve(other[:width + 1], fresh)
    try:
        write_json(path, {"t_target": curve, "measured": time.time(), "identity": ident,
                          "derived_from": {"n_threads": threads, "widths": sorted(fresh)}})
    except OSError:
        pass
    return curve, (f"the target's curve derived from the one kept at {threads} thread{'s' * (threads != 1)} "
                   f"and {len(fresh)} widths timed now")


def kept_pass_costs(target: BaseBackend, draft: BaseBackend | None, k_max: int,
                    remeasure: bool | None = None) -> Costs:
    """``pass_costs`` for this machine, target and draft, measured once and kept (``costs_dir``).
    The probe costs seconds on a 1.5B model (bench/calibration_cost.py), which every ``k="auto"``
    run would otherwise pay before its first token. A kept entry is evidence, not truth: it is used
    only if it holds finite positive times and its T(1) is within ``PLAUSIBLE`` of a fresh one-token
    pass taken now (one pass; a machine busy then or now, or an entry edited by hand, fails this);
    otherwise, or when ``remeasure`` (default ``remeasure_asked()``), the costs are measured again
    and rewritten whole: the target's curve from ``kept_curve`` (shared by every draft in front of
    that target, measured in ``KEPT_REPEATS`` sweeps), the draft's pass timed now. One that cannot
    be written is only not kept. ``Costs.note`` says which."""
    ident = {"target": _identity(target), "draft": _identity(draft), "k_max": k_max,
             "host": platform.node(), "cpus": os.cpu_count()}
    path = costs_dir() / f"{_key(ident)}.json"
    asked = remeasure_asked() if remeasure is None else remeasure
    why = "as asked (--remeasure or SPECMAC_REMEASURE=1)" if asked else ""
    if not why:
        kept = _read_kept(path, k_max)
        if isinstance(kept, str):
            why = f"because {kept}" if kept else ""
        else:
            now = fresh_t1(target)
            ratio = kept[0][0] / now
            if not _believed(kept[0][0], now):
                why = (f"because the kept T(1) {_ms(kept[0][0])} is {_x(ratio)} a fresh one-token pass "
                       f"({_ms(now)}; believed within {PLAUSIBLE:g}x)")
            else:
                return Costs(kept[0], kept[1], True, f"kept from an earlier run (T(1) {_ms(kept[0][0])}, "
                             f"a fresh pass {_ms(now)})", path, _curve_entry(target)[1])
    t_target, curve_path, curve_how = kept_curve(target, k_max, remeasure=asked)
    t_draft = draft_pass(draft)
    done = f"re-measured {why}" if why else "measured before the first token"
    if curve_how:
        done += f" ({curve_how})"
    try:
        write_json(path, {"t_target": t_target, "t_draft": t_draft, "measured": time.time(),
                          "identity": ident})
    except OSError as e:
        return Costs(t_target, t_draft, False, f"{done}; could not keep: {e.strerror or e} "
                     f"({e.filename or path})", None)
    return Costs(t_target, t_draft, False, f"{done}, kept for later runs", path, curve_path)


def cached_pass_costs(target: BaseBackend, draft: BaseBackend | None,
                      k_max: int) -> tuple[list[float], float, bool]:
    """``kept_pass_costs`` as (T_t(n), T_d(1), whether they came from the cache)."""
    c = kept_pass_costs(target, draft, k_max)
    return c.t_target, c.t_draft, c.cached


class CheckedK(AdaptiveK):
    """AdaptiveK whose kept costs face the run's own passes: once ``MIN_SEEN`` target passes have a
    median ratio to the kept cost of their width beyond ``DISAGREE`` (either way), the kept entry is
    dropped (the next run measures again) and the note says so. The run itself goes on from its
    own timings, which the policy weighs in as it always does."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.kept: Costs | None = None
        self.calibration_note = ""  # what became of the kept costs, for the run's stats
        self._ratios: list[float] = []  # the run's target passes (score alone) / the kept cost

    def update(self, event) -> None:
        super().update(event)
        kept, n = self.kept, event.n_drafted + 1
        if kept is None or kept.path is None or event.t_target <= 0 or self.costs.steps <= 1 \
                or n > len(kept.t_target) or abs(event.t_target - kept.t_target[n - 1]) <= FLOOR_S:
            return
        self._ratios.append(event.t_target / kept.t_target[n - 1])
        ratio = float(np.median(self._ratios))
        if len(self._ratios) >= MIN_SEEN and (ratio > DISAGREE or ratio < 1 / DISAGREE):
            try:
                kept.path.unlink(missing_ok=True)
                if kept.curve_path is not None:  # else the next run's entry would be made from it again
                    kept.curve_path.unlink(missing_ok=True)
                after = "the kept entry is dropped: the next run measures again"
            except OSError as e:
                after = f"could not drop the kept entry ({e.strerror})"
            self.calibration_note += (f"; this run's target passes took {_x(ratio)} the kept costs (median "
                                      f"of {len(self._ratios)}): {after}")
            self.kept = None

    def info(self) -> dict:
        return super().info() | {"calibration_note": self.calibration_note}


def adaptive_policy(target: BaseBackend, draft: BaseBackend | None, *, calibrate: bool = True,
                    cache: bool = True, n_prompt: int | None = None, **kw) -> AdaptiveK:
    """An AdaptiveK for this target and draft, started from measured costs (``calibrate``; kept
    between runs with ``cache``, see ``cached_pass_costs``). A pair whose context window is too
    small to probe starts uncalibrated and explores instead. With a draft model and ``n_prompt``
    (the prompt's tokens) it also knows what the draft's prefill of the prompt will cost
    (``set_prefill``), so it drafts only where that can be won back in the run's tokens."""
    policy = CheckedK(**kw)
    if calibrate:
        t0 = time.perf_counter()
        try:
            if cache:
                policy.kept = kept_pass_costs(target, draft, policy.k_max)
                t_target, t_draft = policy.kept.t_target, policy.kept.t_draft
                policy.calibration_cached, policy.calibration_note = policy.kept.cached, policy.kept.note
            else:
                t_target, t_draft = pass_costs(target, draft, policy.k_max)
                policy.calibration_note = "measured before the first token, not kept"
        except SpecmacError:  # e.g. a context window too small to probe
            return policy
        policy.set_costs(t_target, t_draft)
        if draft is not None and n_prompt:
            rate = cached_prefill_per_token(draft) if cache else prefill_per_token(draft)
            policy.set_prefill(rate, n_prompt)
        policy.calibration_s = time.perf_counter() - t0
    return policy
