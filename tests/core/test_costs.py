"""The cost model: closed forms, the measured-curve speedup, best K, reasons, and ``Costs``, the step
costs the planner weighs (measured before a run, refined by it)."""

from __future__ import annotations

import numpy as np
import pytest

from specmac.core.costs import (
    Costs,
    acceptance_from_stats,
    best_k,
    expected_tokens,
    fit_beta,
    predicted_speedup,
    speedup_table,
    why_not,
)
from specmac.core.loop import Event
from specmac.core.runstats import RunStats


def brute_expected(alpha: float, k: int) -> float:
    """sum over accepted lengths a of P(a) * (a + 1), by enumeration (float64)."""
    p = [alpha**a * (1 - alpha) for a in range(k)] + [alpha**k]
    return sum(pa * (a + 1) for a, pa in enumerate(p))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.999, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4, 16])
def test_expected_tokens_closed_form(alpha, k):
    assert expected_tokens(alpha, k) == pytest.approx(brute_expected(alpha, k), abs=1e-12)
    assert expected_tokens([alpha], k) == pytest.approx(brute_expected(alpha, k), abs=1e-12)


def test_expected_tokens_profile():
    assert expected_tokens([1.0, 1.0, 0.0], 3) == pytest.approx(3.0)
    assert expected_tokens([0.9, 0.5], 2) == pytest.approx(1 + 0.9 + 0.45)
    # a short profile is extended with its last value; an unreached position inherits the one before
    assert expected_tokens([0.9, 0.5], 4) == pytest.approx(1 + 0.9 + 0.45 + 0.225 + 0.1125)
    assert expected_tokens([0.9, None, 0.5], 3) == pytest.approx(1 + 0.9 + 0.81 + 0.405)
    with pytest.raises(ValueError, match="out of range"):
        expected_tokens(1.5, 3)


@pytest.mark.parametrize("alpha,c", [(0.6, 0.1), (0.8, 0.3), (0.95, 0.05), (0.4, 0.9)])
def test_free_verification_reproduces_closed_form(alpha, c):
    """With T(K+1) = T(1) the speedup is the paper's (1 - a^(K+1)) / ((1 - a)(K c + 1))."""
    t1 = 7.0
    for k in range(1, 17):
        closed = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
        assert predicted_speedup(k, alpha, c * t1, [t1] * 17) == pytest.approx(closed, rel=1e-12)
        assert predicted_speedup(k, alpha, c * t1, lambda n: t1) == pytest.approx(closed, rel=1e-12)


def test_serial_verification_never_pays():
    t1 = 10.0
    serial = [t1 * n for n in range(1, 18)]
    for alpha in (0.5, 0.9, 0.99):
        k, s = best_k(alpha, 0.5, serial)
        assert s < 1.0
        reasons = why_not(alpha, 0.5, serial, beta=1.0)
        assert reasons[0] == "verification serial: \u03b2 = 1.00"


def test_best_k_is_argmax_of_table():
    curve = [5.0 * (1 + 0.1 * (n - 1)) for n in range(1, 18)]
    table = speedup_table(0.8, 0.5, curve)
    k, s = best_k(0.8, 0.5, curve)
    assert [r["k"] for r in table] == list(range(1, 17))
    assert s == max(r["predicted_speedup"] for r in table)
    assert table[k - 1]["predicted_speedup"] == s
    assert why_not(0.8, 0.5, curve, beta=0.1) == []


def test_reason_draft_too_slow():
    reasons = why_not(0.5, 6.2, [10.0] * 17, beta=0.0)
    assert reasons == ["draft too slow: c = 0.62"]


def test_curve_extrapolates_linearly():
    # T(n) measured up to n = 3 only; beyond it the last slope continues
    s = predicted_speedup(4, 1.0, 0.0, [1.0, 1.5, 2.0])
    assert s == pytest.approx(5 * 1.0 / 3.0)


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.5, 1.0])
def test_fit_recovers_beta_from_synthetic_timings(beta):
    rng = np.random.default_rng(0)
    n = np.repeat(np.arange(1, 17), 5)
    t = 3.0 * (1 + beta * (n - 1)) * (1 + 0.02 * rng.standard_normal(len(n)))
    t1, b = fit_beta(n, t)
    assert t1 == pytest.approx(3.0, rel=0.03)
    assert b == pytest.approx(beta, abs=0.02)


def test_acceptance_from_stats_is_geometric_mle():
    stats = RunStats()
    # accepted lengths 2 of 4, 4 of 4, 0 of 4: 6 accepted, 2 rejections
    for a in (2, 4, 0):
        stats.add(Event([0] * (a + 1), ["accepted"] * a + ["corrected"], 4, 4, a, 0.0, 0.0, 0.0))
    alpha, profile = acceptance_from_stats(stats, shrink=0.0)
    assert alpha == pytest.approx(6 / 8)
    assert profile == pytest.approx([2 / 3, 2 / 2, 1 / 2, 1 / 1])  # accepted / reached per position


def test_reasons_blame_each_cost_alone_first():
    partly = [10.0 * (1 + 0.6 * (n - 1)) for n in range(1, 18)]
    assert why_not(0.5, 0.0, partly, beta=0.6)[0].startswith("verification too slow: \u03b2 = 0.60")
    # each alone would pay (free draft 1.13x, free verification 1.22x), together they do not (0.89x)
    both = why_not(0.7, 4.0, [10.0 * (1 + 0.5 * (n - 1)) for n in range(1, 18)], beta=0.5)
    assert both == ["draft and verification costs together: c = 0.40, \u03b2 = 0.50 (either alone would "
                    "pay at \u03b1 = 0.70: 1.22x with a free batched pass, 1.13x with a free draft)"]


def test_draft_catch_up_pass():
    from specmac.core.costs import draft_passes

    assert draft_passes(0.5, 2) == 2.0
    assert draft_passes(0.5, 2, catch_up=True) == pytest.approx(2.25)
    assert draft_passes([1.0, 0.5, 0.5], 3, catch_up=True) == pytest.approx(3.25)
    # with a catch-up pass S is E T1 / ((K + a^K) T_d + T(K + 1))
    s = predicted_speedup(2, 0.5, 1.0, [10.0] * 5, catch_up=True)
    assert s == pytest.approx(1.75 * 10.0 / (2.25 + 10.0))




# --- Costs: what the planner weighs a step by ---------------------------------------------------

def test_one_slow_step_does_not_shift_every_width():
    """The run's residual against the measured curve (the loop's overhead, a slower machine) is the
    median of its recent steps': one step stalled by 2 s among steps 1 ms over the curve moves no
    width it did not time. Were it the mean (of the 12 steps), every such width would cost 2 s / 12
    more and the curve would read flat. A machine that slows for good (20 ms a step) moves every
    width within 9 steps."""
    truth = np.array([10e-3 * (1 + 0.1 * n) for n in range(17)])  # T(n) for n = 1..17
    costs = Costs(list(truth), {"m": 1e-3})
    for i in range(12):  # widths 4 and 6 only; the second step stalls
        n = 4 if i % 2 else 6
        costs.observe(n, float(truth[n - 1]) + (2.0 if i == 1 else 1e-3))
    curve = costs.curve()
    for n in (1, 2, 9, 17):  # widths the run did not time
        assert curve[n] == pytest.approx(truth[n - 1] + 1e-3, abs=1e-4), n
    assert curve[17] / curve[1] > 2.0  # the curve's shape stands
    for _ in range(9):  # the machine now 20 ms slower a step
        costs.observe(4, float(truth[3]) + 20e-3)
    assert costs.curve()[9] == pytest.approx(truth[8] + 20e-3, abs=1e-4)


def test_a_stalled_t1_probe_is_capped_by_the_wider_passes_the_run_timed():
    """A busy machine stalls the probe of T(1) to 10x: plain decoding looks slow and every K looks
    paying. No pass over more tokens costs less than one over fewer, so once the run timed a wider
    width twice, T(1) is at most that width's mean; once only, it is not (one step is no evidence)."""
    truth = [1e-3 * (1 + 0.3 * n) for n in range(17)]
    costs = Costs([10e-3] + truth[1:])
    costs.observe(3, truth[2])
    assert costs.curve()[1] > 5e-3  # one step: not yet
    costs.observe(3, truth[2])
    assert costs.curve()[1] <= truth[2] + 1e-9
    assert costs.curve()[0] == costs.curve()[1]


def test_no_width_reads_dearer_than_a_wider_one_the_run_timed():
    """A width the probe read too dear (a stall during its timings, in every sweep) is one the
    planner avoids, so the run never times it: were it kept dearer than the widths above it, a pass
    of eight sequences would look cheaper for every draft added to it. Once the run timed a wider
    width twice, each narrower width costs at most that width's estimate (once is no evidence); the
    probe alone moves nothing (torch's one-token pass can truly cost more than its two-token one)."""
    probe = [0.1 + 0.02 * n for n in range(1, 34)]
    probe[7] = 0.65  # T(8) read far above T(9) = 0.28
    costs = Costs(probe)
    assert costs.curve()[8] == pytest.approx(0.65)
    costs.observe(9, 0.28)
    assert costs.curve()[8] == pytest.approx(0.65)  # one step: not yet
    costs.observe(9, 0.28)
    c = costs.curve()
    assert c[8] == pytest.approx(0.28) and (np.diff(c[1:34]) >= -1e-12).all()
    assert c[9] == pytest.approx(0.28) and c[20] == pytest.approx(probe[19])  # the others as they were


def test_without_a_measurement_the_run_times_its_own_steps():
    """A fixed K measures nothing before the run: every width costs a unit until a step is timed
    (and seconds of a draft cannot be weighed: ``timed`` is False); then each width costs its own
    mean where seen, the nearest narrower width's where not, and the narrowest seen below it."""
    costs = Costs(t_draft={"m": 2e-3})
    assert not costs.timed and not costs.knows("m") and (costs.curve()[:5] == 1.0).all()
    costs.observe(1, 0.010)
    costs.observe(5, 0.020)
    costs.observe(5, 0.030)
    c = costs.curve()
    assert costs.timed and costs.knows("m") and not costs.knows("other")
    assert c[0] == c[1] == pytest.approx(0.010)
    assert c[2] == c[4] == pytest.approx(0.010)  # not seen: the nearest narrower width's
    assert c[5] == c[9] == pytest.approx(0.025)
    assert costs.widest(32) == 32  # nothing measured: no cap beyond the caller's


def test_a_draft_pass_is_its_measured_pass_refined_by_the_run():
    """The measured pass counts as one observation beside the run's passes: a probe that was slow
    (the draft timed right after the target's sweep) gives way to the run's own timings."""
    costs = Costs([1.0, 1.0], {"m": 0.024})
    assert costs.draft("m") == pytest.approx(0.024)
    for _ in range(10):
        costs.observe_draft("m", 4, 4 * 0.016)
    assert costs.draft("m") == pytest.approx((0.024 + 40 * 0.016) / 41)
    assert costs.draft("unknown") == 0.0 and costs.measured == 2 and costs.widest(32) == 2


def test_a_draft_pass_for_several_sequences_is_read_off_the_lanes_timed():
    """Passes drafting for several sequences at once are kept apart from one sequence's, by number
    of lanes; a count not timed lies on the line between its neighbours, beyond the most timed on
    the last line further; before any is timed, a lane costs a pass of its own."""
    costs = Costs([1.0, 1.0], {"m": 0.02})
    assert costs.draft("m", 4) == pytest.approx(0.08) and costs.lanes("m", 4) == pytest.approx(4.0)
    for _ in range(10):
        costs.observe_draft("m", 1, 0.05, lanes=4)
    assert costs.draft("m") == pytest.approx(0.02)
    assert costs.draft("m", 4) == pytest.approx(0.05) and costs.draft("m", 8) == pytest.approx(0.09)
    assert costs.draft("m", 2) == pytest.approx(0.03)
    assert costs.lanes("m", 4) == pytest.approx(2.5) and costs.lanes("m", 1) == 1.0
    assert costs.lanes("unknown", 4) == 1.0
    assert costs.info()["t_draft_lanes_ms"] == {"m": {4: pytest.approx(50.0)}}


def test_costs_refuse_a_curve_without_two_widths():
    with pytest.raises(ValueError, match="give T\\(1\\) and T\\(2\\)"):
        Costs([1.0])
