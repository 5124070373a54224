"""What ``k="auto"`` times before the first token, and keeps: the costs the planner starts from.

The target's pass at every width the planner may choose (its curve) is measured once per machine,
model and thread count, in ``KEPT_REPEATS`` sweeps, and kept, so a lookup, a model draft and both
in front of one target start from the same costs. Before a run trusts a kept curve it times a few
one-token passes now: where they agree (within ``PLAUSIBLE``) the curve is used, and the run's own
steps refine it; where they do not (the load moved, or another thread count was fitted), the curve
is derived from the kept one and a few widths timed now (``thread_curves.derive_curve``), which
costs a few passes, not a new measurement. A full measurement happens only where nothing is kept
for the target, or where asked (``remeasure``): it is said before it starts (``notify``), and how
far it is and how long is left as it goes (``progress``).

A draft model's pass is timed now on every run (a few passes): a kept draft time that is wrong
would be trusted for ever by a planner that stops drafting on it. Its prefill per token is kept
beside it and measured again where the fresh pass differs from the kept one.

After the run, ``settle`` sets the run's own passes against what was kept: a kept entry the run
contradicts (by ``DISAGREE`` either way) is dropped, so the next run measures again. A draft's
passes are weighed in sum, beyond what one stalled pass adds (``STALL_S``): a tiny draft's pass is
so short that one preemption among a hundred of them multiplies their mean many times.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specmac.backends import BaseBackend
from specmac.core.costs import Costs
from specmac.errors import SpecmacError
from specmac.files import cache_home, write_json
from specmac.tuning.thread_curves import anchor_widths, derive_curve, sibling_curve
from specmac.tuning.timing import Progress, probe_tokens, time_single, timed

KEPT_REPEATS = 3  # sweeps of every width in a kept curve: one preempted pass must not steer later runs
PLAUSIBLE = 1.3  # a kept T(1) within this factor of the median of a few fresh passes is believed
DISAGREE = 3.0  # the run's own passes this far from the kept costs (either way): the entry is dropped
MIN_SEEN = 4  # passes the run must make before it is set against the kept costs
FLOOR_S = 2e-4  # differences below this are timer noise on a tiny model, never a reason to re-measure
STALL_S = 0.1  # one preempted pass on a busy machine: a run's draft time no further off drops nothing
Notify = Callable[[str], None]


def pass_costs(target: BaseBackend, draft: BaseBackend | None, k_max: int, context: int = 16,
               repeats: int = 1, progress: Progress | None = None,
               what: str = "timing the target's passes") -> tuple[list[float], float]:
    """(T_t(n) for n = 1..k_max + 1, T_d(1)), seconds; T_d(1) is 0 without a draft model. Every
    width is timed: llama.cpp switches kernels with the batch size, so T(n) has dips that
    interpolation would miss. ``progress`` hears how far the sweeps are (as ``what``)."""
    costs = sweep_costs(target, list(range(1, k_max + 2)), repeats, context, progress, what)
    return list(costs.values()), draft_pass(draft, context)


def sweep_costs(target: BaseBackend, widths: list[int], repeats: int = 1, context: int = 16,
                progress: Progress | None = None,
                what: str = "timing the target's passes") -> dict[int, float]:
    """{n: T_t(n)} for the ascending ``widths`` (1 first), seconds: a warm-up pass at the widest and
    at one token, then ``repeats`` sweeps; T(1), every choice's yardstick, the median of
    ``repeats`` + 2, every other width of ``repeats``. ``progress`` hears of every pass (``what``,
    in seconds of passes: those timed and an estimate of the rest)."""
    if repeats < 1:
        raise ValueError(f"repeats {repeats} is out of range: use 1 or more")
    order = (widths[-1], 1, *widths * repeats, 1, 1)
    if progress is not None:
        progress(f"{what}: pass 0 of {len(order)}", 0, 1)
    ids = probe_tokens(target, context + widths[-1])
    try:
        target.reset()
        target.prefill(ids[:context])
        times: dict[int, list[float]] = {}
        for i, n in enumerate(order):
            target.rewind(context)
            times.setdefault(n, []).append(timed(target, lambda n=n: target.score(ids[context:context + n])))
            if progress is not None:
                done = sum(map(sum, times.values()))
                progress(f"{what}: pass {i + 1} of {len(order)}", done, done + _rest(order[i + 1:], times))
    finally:
        target.reset()
    return {n: float(np.median(times[n][-(repeats + 2 if n == 1 else repeats):])) for n in widths}


def _rest(order: tuple[int, ...], times: dict[int, list[float]]) -> float:
    """Seconds the passes at widths ``order`` should take: a width's last time, else one between
    the last times at one token and at the widest (the first two passes), in proportion."""
    wide = max(times)
    t1, tw = times.get(1, times[wide])[-1], times[wide][-1]
    return sum(times[n][-1] if n in times else t1 + (tw - t1) * (n - 1) / max(wide - 1, 1) for n in order)


def draft_pass(draft: BaseBackend | None, context: int = 16, repeats: int = 3) -> float:
    """T_d(1), seconds: the median of ``repeats`` one-token passes of the draft after a warm-up one
    (0 without a draft model)."""
    return time_single(draft, context=context, repeats=repeats, warmup=1)["median_ms"] / 1e3 if draft else 0.0


def prefill_per_token(backend: BaseBackend, n: int = 32) -> float:
    """Seconds per token of the backend's prefill of n tokens (the better of two, after a warm-up
    pass): what it pays to catch up on text it has not seen, per token."""
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


def fresh_t1(target: BaseBackend, repeats: int = 3) -> float:
    """A one-token pass timed now, seconds: what a kept T(1) is checked against. A target that holds
    a context (an earlier run's: its weights are paged in) is timed twice after it, the faster
    counting (a stall slows one pass, never speeds one), and the context is kept; a fresh one is
    prefilled and timed ``repeats`` times after a warm-up pass, the median counting."""
    ids = probe_tokens(target, 2)
    held = target.n_past
    if 0 < held < target.n_ctx:
        try:
            return min(timed(target, lambda: target.score(ids[:1])) for _ in range(2))
        finally:
            target.rewind(held)
    try:
        target.reset()
        target.prefill(ids[:1])
        times = []
        for _ in range(repeats + 1):
            target.rewind(1)
            times.append(timed(target, lambda: target.score(ids[1:2])))
        return float(np.median(times[1:]))
    finally:
        target.reset()


# --- the kept entries ------------------------------------------------------------------------------
def costs_dir() -> Path:
    """Where measured pass costs are kept: $SPECMAC_CACHE/calibration, else ~/.cache/specmac/calibration."""
    return cache_home() / "calibration"


def _entry(kind: str, backend: BaseBackend) -> tuple[dict, Path]:
    """(what a kept ``kind`` entry depends on, its file): a "curve" is the target's, a "draft" a draft's."""
    role = "target" if kind == "curve" else "draft"
    ident = {role: backend.identity(), "host": platform.node(), "cpus": os.cpu_count()}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return ident, costs_dir() / f"{kind}-{key}.json"


def _read(path: Path, field: str) -> tuple[list[float] | None, str]:
    """(the entry's times under ``field``, "") or (None, why there are none: "" where none is kept)."""
    try:
        value = json.loads(path.read_text("utf-8"))[field]
        times = [float(x) for x in (value if isinstance(value, list) else [value])]
    except (FileNotFoundError, NotADirectoryError):
        return None, ""
    except OSError as e:
        return None, f"the kept entry cannot be read ({e.strerror})"
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, "the kept entry is malformed"
    bad = next((x for x in times if not (math.isfinite(x) and x > 0)), None)
    if not times or bad is not None:
        return None, f"the kept entry holds {bad} s, not a finite positive time"
    return times, ""


def _keep(path: Path, record: dict) -> str:
    """Write a kept entry; -> "" or why it could not be kept (the run goes on either way)."""
    try:
        write_json(path, {**record, "measured": time.time()})
    except OSError as e:
        return f"; could not keep it: {e.strerror or e} ({e.filename or path})"
    return ""


def _say(notify: Notify | None, message: str) -> None:
    if notify is not None:
        notify(message)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


@dataclass
class Kept:
    """What a run's costs were kept as: the entries and their values, for ``settle`` after the run."""

    curve: Path | None = None
    t_target: list[float] = field(default_factory=list)
    drafts: dict[str, tuple[Path, float]] = field(default_factory=dict)  # name -> (entry, kept T_d(1))


def kept_curve(target: BaseBackend, width: int, remeasure: bool = False, notify: Notify | None = None,
               progress: Progress | None = None) -> tuple[list[float], str, Path]:
    """(T_t(n) for n = 1..width + 1, how it was come by, its entry): module docstring. ``notify``
    hears what a long measurement is and why before it starts, ``progress`` how far it is."""
    ident, path = _entry("curve", target)
    kept, why = (None, "") if remeasure else _read(path, "t_target")
    if kept is not None and len(kept) >= width + 1:
        now = fresh_t1(target)
        ratio = kept[0] / now
        if 1 / PLAUSIBLE <= ratio <= PLAUSIBLE or abs(kept[0] - now) <= FLOOR_S:
            return kept[:width + 1], f"kept (T(1) {_ms(kept[0])}, {_ms(now)} now)", path
        widths = anchor_widths(len(kept) - 1)
        guess = 2 * sum(kept[n - 1] for n in widths) / ratio + 3 * now
        _say(notify, f"the kept curve's T(1) is {_ms(kept[0])}, {_ms(now)} now: deriving it from "
             f"{len(widths)} widths timed now, about {guess:.1f} s")
        curve = derive_curve(kept, sweep_costs(target, widths, repeats=2, progress=progress,
                                               what="deriving the target's curve"))
        how = (f"derived from the kept curve (T(1) {_ms(kept[0])}, {_ms(now)} now) and {len(widths)} "
               "widths timed now")
        # kept on a busier machine than now, or broken (no load moves a pass this far): replaced
        if ratio > PLAUSIBLE or ratio < 1 / DISAGREE:
            failed = _keep(path, {"t_target": curve, "identity": ident, "rescaled": True})
            how += failed or ", kept in its place"
        return curve[:width + 1], how, path
    if kept is None and not why and not remeasure:
        sibling = sibling_curve(costs_dir(), ident, width + 1)
        if sibling is not None:
            (other, threads) = sibling
            widths = anchor_widths(width)
            guess = 2 * sum(other[n - 1] for n in widths) + 3 * other[0]
            _say(notify, f"deriving the target's curve at this thread count from the one kept at {threads} "
                 f"thread{'s' * (threads != 1)}: {len(widths)} widths timed now, about {guess:.1f} s")
            fresh = sweep_costs(target, widths, repeats=2, progress=progress,
                                what="deriving the target's curve")
            curve = derive_curve(other[:width + 1], fresh)
            how = (f"derived from the curve kept at {threads} thread{'s' * (threads != 1)} and "
                   f"{len(fresh)} widths timed now")
            how += _keep(path, {"t_target": curve, "identity": ident,
                                "derived_from": {"n_threads": threads, "widths": sorted(fresh)}})
            return curve, how, path
    # said at once (no pass timed first to guess how long): ``progress`` says how long is left
    _say(notify, f"measuring the target's pass at {width + 1} widths, {KEPT_REPEATS} sweeps, once for this "
         "machine, model and thread count (kept for later runs)")
    t0 = time.perf_counter()
    curve, _ = pass_costs(target, None, width, repeats=KEPT_REPEATS, progress=progress,
                          what="measuring the target's pass costs")
    if not why:
        why = "as asked" if remeasure else "none was kept" if kept is None else "the kept one was narrower"
    how = f"measured in {time.perf_counter() - t0:.1f} s ({why})"
    return curve, how + _keep(path, {"t_target": curve, "identity": ident}), path


def kept_draft(draft: BaseBackend, remeasure: bool = False) -> tuple[float, float, str, Path]:
    """(T_d(1) timed now, prefill seconds per token, how, its entry): module docstring."""
    ident, path = _entry("draft", draft)
    t_draft = draft_pass(draft, repeats=2)
    kept, why = (None, "as asked") if remeasure else _read(path, "t_draft")
    rate, why_rate = (None, "") if remeasure else _read(path, "prefill")
    if kept is not None and rate is not None:
        if 1 / PLAUSIBLE <= kept[0] / t_draft <= PLAUSIBLE or abs(kept[0] - t_draft) <= FLOOR_S:
            return t_draft, rate[0], f"pass {_ms(t_draft)} now, prefill kept", path
        why = f"its kept pass {_ms(kept[0])} is not now's"
    rate_now = prefill_per_token(draft)
    why = why or why_rate or "none was kept"
    how = f"pass {_ms(t_draft)} and prefill measured now ({why})"
    how += _keep(path, {"t_draft": t_draft, "prefill": rate_now, "identity": ident})
    return t_draft, rate_now, how, path


def measure_costs(target: BaseBackend | None, drafts: Mapping[str, BaseBackend], width: int, *,
                  remeasure: bool = False, notify: Notify | None = None,
                  progress: Progress | None = None) -> tuple[Costs, Kept]:
    """The planner's costs: the target's curve out to ``width`` drafts (None: the run's own steps
    time it, a fixed K) and each draft model's pass and prefill rate. A target whose context window
    is too small to probe gets no curve (the run times its own steps). ``notify`` hears of a long
    measurement before it starts, ``progress`` how far it is (``kept_curve``)."""
    kept, notes = Kept(), []
    t_target = None
    if target is not None:
        try:
            t_target, how, kept.curve = kept_curve(target, width, remeasure, notify, progress)
            kept.t_target = list(t_target)
            notes.append(f"target: {how}")
        except SpecmacError as e:  # e.g. a context window too small to probe
            notes.append(f"target: not measured ({e})")
    t_draft, prefill = {}, {}
    for name, backend in drafts.items():
        t_draft[name], prefill[name], how, path = kept_draft(backend, remeasure)
        kept.drafts[name] = (path, t_draft[name])
        notes.append(f"{name} draft: {how}")
    return Costs(t_target, t_draft, prefill, note="; ".join(notes)), kept


def settle(costs: Costs, kept: Kept) -> str:
    """After a run: drop each kept entry the run's own passes contradict (median ratio of the
    widths it timed, ``MIN_SEEN`` passes or more, beyond ``DISAGREE`` either way); -> what was done."""
    said = []
    seen = np.flatnonzero(costs.n_seen[1:len(kept.t_target) + 1]) + 1
    if kept.curve is not None and costs.n_seen[seen].sum() >= MIN_SEEN:
        means = costs.t_seen[seen] / costs.n_seen[seen]
        ratio = float(np.median(means / np.asarray(kept.t_target)[seen - 1]))
        if not 1 / DISAGREE <= ratio <= DISAGREE and abs(means.mean() - np.mean(kept.t_target)) > FLOOR_S:
            said.append(_drop(kept.curve, f"this run's target passes took {ratio:.2g}x the kept curve"))
    for name, (path, t) in kept.drafts.items():
        passes, seconds = costs.draft_seen.get(name, (0, 0.0))
        if passes >= MIN_SEEN and not 1 / DISAGREE <= (seconds / passes) / t <= DISAGREE \
                and abs(seconds - passes * t) > max(passes * FLOOR_S, STALL_S):
            ratio = seconds / passes / t
            said.append(_drop(path, f"this run's {name} draft passes took {ratio:.2g}x its timed pass"))
    return "; ".join(said)


def _drop(path: Path, why: str) -> str:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        return f"{why}: could not drop the kept entry ({e.strerror})"
    return f"{why}: the kept entry is dropped, the next run measures again"
