"""What k="auto" measures before a run and keeps: trusted no more than it should be.

The target's curve is measured in full once per machine and model and said before it starts; a
kept curve is checked against fresh passes and, where the load moved, derived from a few widths
timed now, never measured in full again; a draft's pass is timed fresh every run; what a run
contradicts is dropped after it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.tuning import calibration


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def full(monkeypatch):
    """The full measurements made (pass_costs calls: their sweeps), counted."""
    calls: list[int] = []
    real = calibration.pass_costs
    monkeypatch.setattr(calibration, "pass_costs",
                        lambda *a, **kw: calls.append(kw.get("repeats", 1)) or real(*a, **kw))
    return calls


def target(latency_ms: float = 1.0):
    return load_backend("synthetic", None, {"latency_ms": latency_ms}, role="target")


def draft(latency_ms: float = 0.5):
    return load_backend("synthetic", None, {"latency_ms": latency_ms}, role="draft")


def test_pass_costs_takes_the_median_of_sweeps(monkeypatch):
    """Every width timed in sweeps: one preempted pass does not make its width look slow in three
    (it does in one)."""
    t = target(0.0)

    def slow_at(i):  # timings in order: width 4 and 1 (warm-up), then sweeps of widths 1..4, then 1, 1
        calls = []

        def fake(backend, fn):
            fn()
            calls.append(1)
            return 100.0 if len(calls) == i else 1.0

        return fake

    monkeypatch.setattr(calibration, "timed", slow_at(8))  # width 2 of the second sweep
    assert calibration.pass_costs(t, None, 3, repeats=3)[0] == [1.0] * 4
    monkeypatch.setattr(calibration, "timed", slow_at(4))  # width 2 of the only sweep
    assert calibration.pass_costs(t, None, 3, repeats=1)[0] == [1.0, 100.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="repeats 0"):
        calibration.pass_costs(t, None, 3, repeats=0)


def test_the_curve_is_measured_once_said_before_and_kept(cache, full):
    t, said = target(5.0), []  # passes long enough that a loaded machine's jitter stays within PLAUSIBLE
    costs, kept = calibration.measure_costs(t, {"synthetic": draft(5.0)}, 16, notify=said.append)
    assert full == [3] and len(said) == 1 and said[0].startswith("measuring the target's pass at 17 widths")
    assert "measured in" in costs.note and "(none was kept)" in costs.note and costs.measured == 17
    again, _ = calibration.measure_costs(t, {"synthetic": draft(5.0)}, 16, notify=said.append)
    assert full == [3] and len(said) == 1 and "target: kept (T(1)" in again.note
    assert np.array_equal(again.prior, costs.prior)
    assert "prefill kept" in again.note  # the draft's pass timed now, its prefill rate kept
    narrow, _ = calibration.measure_costs(t, {}, 8)  # narrower: the kept curve's first widths
    assert full == [3] and narrow.measured == 9 and np.array_equal(narrow.prior, costs.prior[:10])
    wide, _ = calibration.measure_costs(t, {}, 32)  # wider than kept: measured at the wider width
    assert full == [3, 3] and wide.measured == 33 and "the kept one was narrower" in wide.note
    assert not list(calibration.costs_dir().glob(".*"))  # no temporary left


@pytest.mark.parametrize("damage, why", [("{", "malformed"), ('{"t_target": [1.0, "x"]}', "malformed"),
                                         ('{"t_target": [NaN, 1.0]}', "holds nan s"),
                                         ('{"t_target": [-1.0, 1.0]}', "holds -1.0 s")])
def test_a_damaged_entry_says_why_it_is_measured_again(cache, full, damage, why):
    t = target()
    calibration.measure_costs(t, {}, 4)
    (path,) = calibration.costs_dir().glob("curve-*.json")
    path.write_text(damage)
    costs, _ = calibration.measure_costs(t, {}, 4)
    assert full == [3, 3] and why in costs.note and costs.measured == 5
    assert len(json.loads(path.read_text())["t_target"]) == 5  # rewritten whole


@pytest.mark.parametrize("scale, replaced", [(3.0, True), (0.5, False), (1e-3, True)])
def test_where_the_load_moved_the_curve_is_derived_not_measured_again(cache, full, scale, replaced):
    """A kept T(1) that disagrees with fresh passes: the curve is derived from the kept one and a
    few widths timed now (a few passes, not a measurement). It replaces the kept one where that was
    slower (measured on a busier machine) or absurd (no load moves a pass a thousandfold), and is
    used for this run only where the machine is busier now. (Passes of 10 ms: at 2 ms a busy
    machine's scheduling moved a fresh T(1) across the factors that decide.)"""
    t = target(10.0)
    first, _ = calibration.measure_costs(t, {}, 16)
    (path,) = calibration.costs_dir().glob("curve-*.json")
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(entry | {"t_target": [x * scale for x in entry["t_target"]]}))
    said: list[str] = []
    costs, _ = calibration.measure_costs(t, {}, 16, notify=said.append)
    assert full == [3] and "derived from the kept curve" in costs.note
    assert len(said) == 1 and "deriving it from" in said[0]  # what it pays, said before it pays it
    assert costs.prior[1] == pytest.approx(first.prior[1], rel=0.5)  # seconds of now, not the kept ones
    kept_now = json.loads(path.read_text())["t_target"][0]
    assert (kept_now == pytest.approx(costs.prior[1], rel=1e-9)) == replaced
    assert ("kept in its place" in costs.note) == replaced


def test_remeasure_is_an_argument_not_the_environment(cache, full, monkeypatch):
    pair = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 1})
    pair.planner("auto")
    monkeypatch.setenv("SPECMAC_REMEASURE", "1")  # the old switch: no longer read
    pair.planner("auto")
    assert full == [3]
    planner = pair.planner("auto", remeasure=True)
    assert full == [3, 3] and "(as asked)" in planner.costs.note


def test_a_kept_draft_pass_is_never_trusted_over_a_fresh_one(cache):
    """A wrong kept draft time would be trusted for ever by a planner that stops drafting on it (it
    never drafts, so never times it): the pass is timed now every run, and where it disagrees with
    the kept one the prefill rate kept beside it is measured again too."""
    d = draft(0.5)
    calibration.measure_costs(None, {"synthetic": d}, 4)
    (path,) = calibration.costs_dir().glob("draft-*.json")
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(entry | {"t_draft": entry["t_draft"] * 20, "prefill": entry["prefill"] * 20}))
    costs, _ = calibration.measure_costs(None, {"synthetic": d}, 4)
    # measured again, not the kept 20x (a timing on a shared machine: within 5x, not within 50 %)
    assert costs.draft("synthetic") < entry["t_draft"] * 5
    assert costs.prefill("synthetic") < entry["prefill"] * 5
    assert "is not now's" in costs.note


def test_what_a_run_contradicts_is_dropped_after_it(cache):
    t, d = target(), draft()
    costs, kept = calibration.measure_costs(t, {"synthetic": d}, 8)
    assert calibration.settle(costs, kept) == ""  # nothing timed: nothing to say
    for _ in range(6):
        costs.observe(3, 10 * kept.t_target[2])  # the run's passes ten times the kept curve's
    said = calibration.settle(costs, kept)
    assert "took 10x the kept curve" in said and not kept.curve.exists()
    t_d = kept.drafts["synthetic"][1]
    costs.observe_draft("synthetic", 8, 8 * t_d + 8 * calibration.STALL_S)  # far beyond one stall
    assert "synthetic draft passes took" in calibration.settle(costs, kept)
    assert not kept.drafts["synthetic"][0].exists()


def test_one_stalled_pass_of_a_tiny_draft_drops_nothing(cache):
    """A tiny draft's pass is a few microseconds: one preemption among a hundred of its passes
    multiplies their mean many times, yet says nothing about its kept prefill (a CI run dropped a
    sound entry so). The run's draft time is weighed in sum, beyond one stall; its mean still
    counts where the draft's own time is long enough to tell."""
    costs, kept = calibration.measure_costs(None, {"synthetic": draft(0.0)}, 8)
    path, t_d = kept.drafts["synthetic"]
    costs.observe_draft("synthetic", 100, 100 * t_d + 0.05)  # one 50 ms stall
    assert (100 * t_d + 0.05) / 100 > 3 * t_d  # the mean alone reads it as a contradiction
    assert calibration.settle(costs, kept) == "" and path.exists()


def test_the_api_settles_after_a_run_and_the_stats_say_it(cache):
    pair = Pair.load("synthetic", "lookup+synthetic", target_options={"latency_ms": 1})
    planner = pair.planner("auto")
    assert planner.kept is not None and planner.settled == ""
    planner.kept.t_target = [x / 50 for x in planner.kept.t_target]  # as if kept on a far faster machine
    pair.generate("the cat sat on the mat and the cat sat on", k=planner, max_tokens=96)
    assert "the kept entry is dropped" in planner.info()["settled"]


def test_the_kept_curves_check_costs_a_few_passes_after_a_run(cache):
    """Every k="auto" run checks the kept T(1) against passes timed now: after a run the target
    holds its context, its weights paged in, so the check follows it and is rewound (the next run's
    prompt is the only prefill); a fresh target is prefilled first."""
    pair = Pair.load("synthetic", "lookup", target_options={"latency_ms": 1})
    t = pair.target
    pair.generate("the cat sat on the mat and the cat sat", max_tokens=8, k="auto")
    calls: list[str] = []
    for name in ("prefill", "score"):
        real = getattr(t, name)
        setattr(t, name, lambda ids, real=real, name=name: calls.append(name) or real(ids))
    held = t.n_past
    before = t.score([5])
    t.rewind(held)
    calls.clear()
    assert held > 0 and calibration.fresh_t1(t) > 0
    assert set(calls) == {"score"} and t.n_past == held
    assert np.array_equal(t.score([5]), before)
    t.reset()
    calls.clear()
    calibration.fresh_t1(t)
    assert calls[0] == "prefill" and t.n_past == 0


def test_the_prefill_rate_is_measured():
    # (1 + 0.3 * 31) ms over 32 tokens, plus the sleeps' overshoot
    d = load_backend("synthetic", None, {"latency_ms": 1, "beta": 0.3}, role="draft")
    assert 0.3e-3 < calibration.prefill_per_token(d) < 1e-3
