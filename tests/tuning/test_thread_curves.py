"""A target's curve at a thread count with none kept, derived from the curve kept at another count
(tuning/thread_curves.py), as the thread fit's fewer threads on a busy machine ask for."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from specmac.backends.synthetic import SyntheticBackend
from specmac.tuning import calibration
from specmac.tuning.thread_curves import anchor_widths, derive_curve

T1 = 5e-3  # a one-token pass of the synthetic targets, seconds: long beside a sleep's overshoot


def cost(n, per_width: float):
    """Seconds of a pass over n tokens of ``_target(threads, per_width)``."""
    return T1 * (1 + per_width * (np.asarray(n) - 1))


def test_anchor_widths():
    assert anchor_widths(32) == [1, 2, 4, 8, 16, 33]
    assert anchor_widths(8) == [1, 2, 4, 9]
    assert anchor_widths(3) == [1, 2, 4]
    assert anchor_widths(1) == [1, 2]


def test_a_derived_curve_keeps_the_kept_curves_steps():
    """Between the timed widths each width keeps its place on the kept curve: a width the kernels
    favour (5 here, cheaper than 4) stays cheaper at the other thread count. Interpolating the fresh
    timings alone would lose it."""
    other = [1.0, 1.5, 2.0, 3.0, 2.5, 3.5, 4.0, 5.0, 5.5]
    fresh = {1: 1.0, 2: 1.6, 4: 3.3, 8: 6.5, 9: 7.4}  # the ratio grows from 1x to 1.35x with the width
    curve = derive_curve(other, fresh)
    assert [curve[n - 1] for n in fresh] == pytest.approx(list(fresh.values()))
    assert curve[4] < curve[3]  # the dip at 5 is kept
    assert 3.3 / 3.0 < curve[4] / other[4] < 6.5 / 5.0  # scaled between its neighbours' ratios
    assert len(curve) == len(other)


def _target(threads: int, per_width: float):
    """A synthetic target whose identity names a thread count, each extra width costing
    ``per_width`` of a one-token pass (T1): more per width at fewer threads, as compute-bound
    wide passes are."""
    t = SyntheticBackend(latency_ms=T1 * 1e3)
    t.resolved |= {"n_threads": threads, "n_threads_batch": threads}
    t.scored = []

    score = t.score

    def scored(tokens):
        t.scored.append(len(tokens))
        return score(tokens)

    t._simulate_cost = lambda n: time.sleep(float(cost(n, per_width)))
    t.score = scored
    return t


def test_a_thread_count_without_a_kept_curve_derives_it_from_another_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    k_max = 8
    two = _target(2, 0.3)
    curve2, how, path2 = calibration.kept_curve(two, k_max)
    assert how.startswith("measured in") and "(none was kept)" in how and len(curve2) == k_max + 1
    full = len(two.scored)  # every width, three sweeps

    one = _target(1, 0.6)
    curve1, how, path1 = calibration.kept_curve(one, k_max)
    assert path1 != path2
    n = len(anchor_widths(k_max))
    assert how == f"derived from the curve kept at 2 threads and {n} widths timed now", how
    # two sweeps of the timed widths, two warm-up passes, two more one-token passes, the prefill's call
    assert len(one.scored) == 2 * n + 5 < full / 2
    truth = cost(np.arange(1, k_max + 2), 0.6)
    # the kept curve as it is would read width 9 at 0.59x its cost (its median error 0.35): the
    # derived one is within 25% (in the median: a width timed in milliseconds may catch a hiccup)
    err = np.abs(np.array(curve1) / truth - 1)
    assert np.median(err) < 0.25 and err.max() < 1.5, np.array(curve1) / truth
    entry = json.loads(path1.read_text())
    assert entry["derived_from"] == {"n_threads": 2, "widths": anchor_widths(k_max)}

    one.scored.clear()  # kept now: the next run at one thread checks its T(1) and takes it
    again, how, _ = calibration.kept_curve(one, k_max)
    assert how.startswith("kept (T(1)") and again == curve1
    assert set(one.scored) == {1} and len(one.scored) <= 5  # a few one-token passes, no sweep

    path2.unlink()  # a derived curve is not derived from again: three threads are measured whole
    three = _target(3, 0.2)
    _, how, _ = calibration.kept_curve(three, k_max)
    assert how.startswith("measured in") and len(three.scored) == full


def test_no_curve_is_derived_from_another_target(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    calibration.kept_curve(_target(2, 0.3), 4)
    other = _target(1, 0.6)
    other.resolved["seed"] = 7  # another model
    _, how, _ = calibration.kept_curve(other, 4)
    assert how.startswith("measured in") and len(other.scored) > 2 * len(anchor_widths(4)) + 5


@pytest.mark.parametrize("how", ["nan", "x1000", "strings"])
def test_a_kept_curve_at_another_count_that_lies_is_not_believed(tmp_path, monkeypatch, how):
    """A sibling curve that holds no finite positive times is not derived from (the curve is
    measured whole); one scaled by any factor gives the same derived curve, as the timed widths set
    the scale."""
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    _, _, path2 = calibration.kept_curve(_target(2, 0.3), 8)
    entry = json.loads(path2.read_text())
    t = entry["t_target"]
    entry["t_target"] = {"nan": [float("nan")] + t[1:], "x1000": [x * 1000 for x in t],
                         "strings": ["fast"] * len(t)}[how]
    path2.write_text(json.dumps(entry))
    one = _target(1, 0.6)
    curve, how_now, _ = calibration.kept_curve(one, 8)
    assert ("derived" in how_now) == (how == "x1000"), how_now
    truth = cost(np.arange(1, 10), 0.6)
    # timed on a shared machine in milliseconds: one width may catch a hiccup, the curve may not
    err = np.abs(np.array(curve) / truth - 1)
    assert np.median(err) < 0.25 and err.max() < 1.5, err
