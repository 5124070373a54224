"""bench/replay_oracle.py's bound: its dynamic programme finds the fastest way through a text."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from replay_oracle import fastest  # noqa: E402

from specmac.core.costs import K_MAX, K_MODEL  # noqa: E402


def every_step(n: int, curve: np.ndarray, t_draft: float, lookup: np.ndarray | None,
               model: np.ndarray | None) -> float:
    """The fastest way through n tokens by enumerating every step from every position: a plain
    step, any lookup width up to K_MAX, any model K up to K_MODEL (each keeping as far as its run,
    none where its run is 0)."""

    @functools.lru_cache(None)
    def best(pos: int) -> float:
        if pos >= n:
            return 0.0
        steps = [curve[1] + best(pos + 1)]
        if lookup is not None:
            steps += [curve[w + 1] + best(pos + min(w, lookup[pos]) + 1) for w in range(1, K_MAX + 1)]
        if model is not None:
            steps += [k * t_draft + curve[k + 1] + best(pos + min(k, model[pos]) + 1)
                      for k in range(1, K_MODEL + 1)]
        return min(steps)

    return best(0)


def test_the_bound_is_the_fastest_of_every_choice_of_widths():
    """On curves that are no line (a wider pass may cost less, even less than one token), 300
    random cases, lookup, model and both: the programme equals the enumeration, to rounding. A
    bound that left a choice out would be slower than the enumeration somewhere; one that kept
    more than a run allows, faster."""
    rng = np.random.default_rng(1)
    for trial in range(300):
        n = int(rng.integers(1, 9))
        curve = np.concatenate([[0.0], rng.uniform(0.1, 1.0, K_MAX + 2)])
        room = n - 1 - np.arange(n)
        lookup = np.minimum(rng.integers(0, 5, n), room)
        model = np.minimum(rng.integers(0, 5, n), room)
        for look, mod in ((lookup, model), (lookup, None), (None, model)):
            want = every_step(n, curve, 0.05, look, mod)
            assert abs(fastest(n, curve, 0.05, look, mod) - want) < 1e-9, trial


def test_a_run_curve_takes_the_widths_the_run_timed_and_scales_the_rest():
    """Widths timed twice or more cost what the run paid; the others the probe's times the median
    ratio of the timed wide ones (not the one-token ratio: a long context costs wide rows more)."""
    from replay_oracle import run_curve

    probe = [0.0, 1.0, 1.0, 2.0, 4.0, 8.0]
    rows = [{"width": 1, "steps": 40, "median_s": 1.0}, {"width": 2, "steps": 5, "median_s": 1.2},
            {"width": 3, "steps": 3, "median_s": 2.6}, {"width": 4, "steps": 1, "median_s": 99.0}]
    curve = run_curve({"probe_curve_s": probe, "rows": rows})
    assert curve.tolist() == pytest.approx([1.0, 1.0, 1.2, 2.6, 4.0 * 1.25, 8.0 * 1.25])
    with pytest.raises(SystemExit):
        run_curve({"probe_curve_s": probe, "rows": rows[1:]})
