"""A target's pass-cost curve at one thread count, derived from the curve kept at another.

The thread fit (backends/threads.py) gives a target fewer threads than its default on a busy
machine. Each thread count has its own kept curve (calibration.kept_curve), and measuring a new
one takes long on a large model, inside the run that asked for it. Where a curve is kept
at another count, a few widths timed now (``anchor_widths``, timed by calibration.sweep_costs) and
that curve's shape give this count's curve in seconds. Pure: the timing is the caller's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def _without_threads(ident: dict) -> tuple[dict, int | None]:
    """(a curve's identity less its thread count, that count)."""
    target = dict(ident.get("target") or {})
    options = dict(target.get("options") or {})
    threads = options.pop("n_threads", None)
    options.pop("n_threads_batch", None)
    return ident | {"target": target | {"options": options}}, threads


def sibling_curve(directory: Path, ident: dict, n_widths: int) -> tuple[list[float], int] | None:
    """A curve kept in ``directory`` of the same target on this machine at another thread count, at least
    ``n_widths`` wide, with that count: the nearest count, of those the most recently measured."""
    want, threads = _without_threads(ident)
    if threads is None:
        return None
    found = []
    for f in directory.glob("curve-*.json"):
        try:
            kept = json.loads(f.read_text("utf-8"))
            other, n = _without_threads(kept["identity"])
            curve = [float(x) for x in kept["t_target"]]
            measured = float(kept.get("measured", 0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if other == want and isinstance(n, int) and n != threads and len(curve) >= n_widths \
                and "derived_from" not in kept and all(math.isfinite(x) and x > 0 for x in curve):
            found.append((abs(n - threads), -measured, curve, n))
    if not found:
        return None
    *_, curve, n = min(found, key=lambda e: e[:2])
    return curve, n


def anchor_widths(width: int) -> list[int]:
    """The widths a derived curve is timed at: the powers of two up to half of width + 1, and
    width + 1 (the widest passes cost the most to time: one of them is enough up there)."""
    return sorted({1 << i for i in range((width + 1).bit_length()) if 2 << i <= width + 1} | {width + 1})


def derive_curve(other: list[float], fresh: dict[int, float]) -> list[float]:
    """The curve at this thread count from ``other`` (the kept curve at another count) and fresh
    timings at a few widths: each width's kept cost times the ratio fresh/kept, interpolated in
    log-width between the timed widths. The kernels a width runs are the same at any thread count,
    so the kept curve's dips and steps stay; how much a thread more or fewer changes a pass grows
    with the width (a one-token pass is bound by memory, a wide one by compute), which the ratio
    follows."""
    at = sorted(fresh)
    ratios = [fresh[n] / other[n - 1] for n in at]
    widths = np.arange(1, len(other) + 1)
    scale = np.interp(np.log(widths), np.log(at), ratios)
    return [float(x) for x in np.asarray(other) * scale]
