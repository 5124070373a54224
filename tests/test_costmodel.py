"""The cost model: closed forms, the measured-curve speedup, best K, reasons, adaptive K."""

from __future__ import annotations

import numpy as np
import pytest

from specmac.api import Pair
from specmac.core.calibration import adaptive_policy
from specmac.core.costs import (
    acceptance_from_stats,
    best_k,
    expected_tokens,
    fit_beta,
    predicted_speedup,
    speedup_table,
    why_not,
)
from specmac.core.loop import Event
from specmac.core.policy import AdaptiveK
from specmac.core.runstats import RunStats
from specmac.core.sampling import SamplingParams


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


def test_posterior_moments_are_exact():
    from specmac.core.costs import posterior_moments

    # Beta(1, 1): E[alpha^j] = 1 / (j + 1), so E(K) is the harmonic number H_{K+1}
    m = posterior_moments(1.0, 1.0, 8)
    assert m == pytest.approx([1 / (j + 1) for j in range(9)], rel=1e-12)
    assert m.sum() == pytest.approx(sum(1 / j for j in range(1, 10)), rel=1e-12)
    # many observations: the posterior concentrates and E(K) tends to the geometric closed form
    big = posterior_moments(0.8e6, 0.2e6, 16)
    assert big.sum() == pytest.approx(expected_tokens(0.8, 16), rel=1e-4)
    # uncertainty makes long runs likelier than the point estimate says (Jensen: alpha^j is convex)
    assert (posterior_moments(8.0, 2.0, 16)[2:] > 0.8 ** np.arange(2, 17)).all()


# --- adaptive K ---------------------------------------------------------------------------

def simulate(policy, *, alpha, t_d, t1, beta, steps, seed=0):
    """Feed a policy events of a simulated pair; return (tokens, seconds)."""
    rng = np.random.default_rng(seed)
    tokens = seconds = 0.0
    for _ in range(steps):
        k = policy.next_k()
        assert 0 <= k <= 16  # 0: no drafts, target-only decoding
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        t_draft = k * t_d * (1 + 0.05 * rng.standard_normal())
        t_target = t1 * (1 + beta * k) * (1 + 0.05 * rng.standard_normal())
        ev = Event([0] * (a + 1), ["accepted"] * a + ["bonus" if a == k else "corrected"], k, k, a,
                   t_draft, t_target, 1e-5)
        policy.update(ev)
        tokens += a + 1
        seconds += t_draft + t_target + 1e-5
    return tokens, seconds


class Fixed:
    def __init__(self, k):
        self.k = k

    def next_k(self):
        return self.k

    def update(self, ev):
        pass


@pytest.mark.parametrize("alpha,t_d,beta", [(0.9, 0.05, 0.05), (0.6, 0.2, 0.1), (0.8, 0.02, 0.6),
                                            (0.3, 0.5, 0.0), (0.95, 0.1, 1.0)])
def test_adaptive_k_matches_best_fixed_k(alpha, t_d, beta):
    t1, steps = 1.0, 600
    rates = {k: np.divide(*simulate(Fixed(k), alpha=alpha, t_d=t_d, t1=t1, beta=beta, steps=steps))
             for k in range(0, 17)}  # K = 0: target only
    policy = AdaptiveK()
    auto = np.divide(*simulate(policy, alpha=alpha, t_d=t_d, t1=t1, beta=beta, steps=steps))
    assert auto >= 0.93 * max(rates.values())
    k_star, s_star = best_k(alpha, t_d, lambda n: t1 * (1 + beta * (n - 1)))
    k_star = k_star if s_star > 1.0 else 0  # no K pays: decoding without drafts is best
    settled = np.bincount(policy.history[-200:]).argmax()
    assert abs(settled - k_star) <= 1 or rates[settled] >= 0.97 * rates[k_star]


def test_adaptive_k_in_the_loop():
    pair = Pair.load("synthetic", "synthetic", draft_options={"noise": 0.3})
    policy = adaptive_policy(pair.target, pair.drafter.backend)
    out = pair.generate("hello", params=SamplingParams(temperature=1.0), max_tokens=200, k=policy, seed=1)
    assert out.stats.k == "auto"
    assert len(out.token_ids) > 0
    assert all(0 <= k <= 16 for k in policy.history[:-1])
    assert 0.0 < policy.alpha < 1.0


def test_adaptive_k_vectorised_choice_matches_the_model():
    policy = AdaptiveK(warmup=(), explore_every=0)
    rng = np.random.default_rng(3)
    for _ in range(40):
        d = int(rng.integers(1, 9))
        a = int(rng.integers(0, d + 1))
        policy.update(Event([0] * (a + 1), ["accepted"] * a + ["corrected"], d, d, a,
                            d * 2e-4, 1e-3 * (1 + 0.3 * d) * rng.uniform(0.9, 1.1), 5e-5))
        s, hope = policy._speedups(), policy._speedups(True)
        if s.max() >= 1.0:  # some K is expected to pay: the best one
            assert policy.next_k() == int(np.argmax(s)) + 1
        else:  # none is: plain decoding, or a try at a K that pays at the optimistic acceptance
            assert policy.next_k() == 0 or hope[policy.next_k() - 1] >= 1.0


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


def test_adaptive_k_finds_a_cheap_wide_pass():
    """A curve that is not a line (llama.cpp switches kernels at n = 16): the policy must find it."""

    rng = np.random.default_rng(0)

    def run(policy, steps=400, alpha=0.95, t_d=0.05):
        tokens = seconds = 0.0
        for _ in range(steps):
            k = policy.next_k()
            a = 0
            while a < k and rng.random() < alpha:
                a += 1
            t_target = (1 + 0.8 * k) * (0.45 if k + 1 >= 16 else 1.0)
            policy.update(Event([0] * (a + 1), ["accepted"] * a + ["corrected"], k, k, a, k * t_d,
                                t_target, 0.0))
            tokens, seconds = tokens + a + 1, seconds + k * t_d + t_target
        return tokens / seconds

    best = max(run(Fixed(k)) for k in range(1, 17))
    policy = AdaptiveK()
    assert run(policy) >= 0.9 * best
    assert np.bincount(policy.history[-100:]).argmax() >= 15


def test_calibrated_policy_starts_from_measured_costs():
    """adaptive_policy times the pair first: a serial target with a costly draft cannot pay even with
    every draft accepted, so the policy drafts nothing (K = 0) and never explores (with k_min=1:
    K = 1 throughout); a parallel target with a free, perfect draft starts at a large K."""
    slow = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 2, "beta": 1.0},
                     draft_options={"latency_ms": 1.5})
    policy = adaptive_policy(slow.target, slow.drafter.backend)
    assert policy.prior is not None and policy.schedule == [] and policy.calibration_s > 0
    assert policy.next_k() == 0
    out = slow.generate("hello", params=SamplingParams(0.0), max_tokens=24, k=policy)
    assert set(policy.history) == {0} and out.stats.n_drafted == 0
    always = adaptive_policy(slow.target, slow.drafter.backend, k_min=1)
    slow.generate("hello", params=SamplingParams(0.0), max_tokens=24, k=always)
    assert always.next_k() == 1 and set(always.history[:-1]) == {1}  # the last may be cut by max_tokens
    fast = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 2, "beta": 0.0},
                     draft_options={"noise": 0.0})
    assert adaptive_policy(fast.target, fast.drafter.backend).next_k() >= 4
    assert adaptive_policy(fast.target, fast.drafter.backend, calibrate=False).prior is None


def test_replay_greedy_by_hand():
    from specmac.core.replay import replay_greedy

    t = [1.0, 2.0, 3.0]  # T(1), T(2), T(3)
    # K = 2 on "110111": keep 2 + bonus (0.1 + 0.1 draft, T(3)), then after that full acceptance
    # the catch-up pass (0.3) + 0.1, keep 2 + bonus: 6 tokens in 6.6 s
    assert replay_greedy("110111", 2, 6, t, 0.1, 0.3) == pytest.approx(6 / 6.6)
    assert replay_greedy("110111", 0, 6, t, 0.1, 0.3) == pytest.approx(1.0)  # target only
    # a rejection at the first draft: one token a step, no catch-up pass
    assert replay_greedy("000", 1, 3, t, 0.1, 0.3) == pytest.approx(3 / (2 * (0.1 + 2.0) + 1.0))
    with pytest.raises(ValueError, match="the trace has 3 tokens"):
        replay_greedy("000", 1, 4, t, 0.1, 0.3)


def test_policy_stops_drafting_when_nothing_pays_and_tries_again_later():
    """Rejections make every K a loss: the policy drafts nothing (K = 0). The counts then fade,
    the optimistic acceptance rises and, once what drafting lost (9.6 s) is within 3% of the time
    decoded, drafting is tried again; a perfect run keeps it on."""
    policy = AdaptiveK()
    policy.set_costs([1.0 + 0.3 * n for n in range(17)], 0.1)  # pays only at high acceptance
    assert policy.next_k() >= 1
    for _ in range(12):
        policy.update(Event([0], ["corrected"], 2, 2, 0, 0.2, 1.6, 0.0))
    assert policy.next_k() == 0
    off = 0
    while policy.next_k() == 0:
        policy.update(Event([0], ["target"], 0, 0, 0, 0.0, 1.3, 0.0))
        off += 1
        assert off < 400, "never drafts again"
    assert off > 5  # not on the next step: one rejection run is evidence
    for _ in range(20):
        k = policy.next_k()
        policy.update(Event([0] * (k + 1), ["accepted"] * k + ["bonus"], k, k, k, 0.1 * k,
                            1.3 + 0.3 * k, 0.0))
    assert policy.next_k() >= 2


def test_pass_costs_takes_the_median_of_sweeps(monkeypatch):
    """advise times every width in 3 sweeps: one preempted pass does not make its width look slow
    (with one sweep, as before k="auto"'s first token, it does)."""
    from specmac.core import calibration

    target = Pair.load("synthetic").target

    def slow_at(i):  # timings in order: width 4 and 1 (warm-up), then sweeps of widths 1..4, then 1, 1
        calls = []

        def fake(backend, fn):
            fn()
            calls.append(1)
            return 100.0 if len(calls) == i else 1.0

        return fake

    monkeypatch.setattr(calibration, "timed", slow_at(8))  # width 2 of the second sweep
    assert calibration.pass_costs(target, None, 3, repeats=3)[0] == [1.0] * 4
    monkeypatch.setattr(calibration, "timed", slow_at(4))  # width 2 of the only sweep
    assert calibration.pass_costs(target, None, 3, repeats=1)[0] == [1.0, 100.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="repeats 0"):
        calibration.pass_costs(target, None, 3, repeats=0)


def test_one_rejected_first_step_does_not_switch_a_paying_draft_off():
    """torch bf16 -> torch bf16 at T = 0 in results/anatomy: plain decoding 155 ms per token, a
    verify pass 135 ms, a draft pass 54 ms. One fully rejected first step leaves the Beta(2, 2)
    prior's estimate at 0.40: still drafting. The Jeffreys prior fell to 0.25 and stopped, as it did
    for whole 32-token runs on prose there."""
    def after_one_rejection(**kw) -> int:
        policy = AdaptiveK(**kw)
        policy.set_costs([0.155] + [0.135] * 16, 0.054)
        assert policy.next_k() >= 1
        policy.update(Event([0], ["corrected"], 2, 2, 0, 0.108, 0.135, 0.0))
        return policy.next_k()

    assert after_one_rejection() >= 1
    assert after_one_rejection(prior_weight=1.0) == 0  # the old prior: the control


def test_the_drafts_pass_cost_counts_the_catch_up_pass_once():
    """Steps whose draft time is exactly their passes (the catch-up pass after a fully accepted step
    included) leave the calibrated pass cost where it was."""
    policy = AdaptiveK()
    policy.set_costs([1.0] * 17, 0.05)
    for t_draft, accepted in [(0.1, 1), (0.1, 2), (0.15, 1), (0.1, 1), (0.1, 1)]:
        # the third step follows a fully accepted one: two passes and the catch-up pass
        policy.update(Event([0] * (accepted + 1), ["accepted"] * accepted + ["corrected"], 2, 2, accepted,
                            t_draft, 1.0, 0.0))
    assert policy.t_draft1() == pytest.approx(0.05, abs=1e-12)


def test_the_run_corrects_a_slow_draft_probe():
    """gguf Q4_K_M -> torch bf16 at T = 0 in results/anatomy_auto: calibration timed the draft's pass
    at 24 ms (right after the torch target's sweep), the run at 16 ms. Kept at the probe's value,
    the policy stayed at K = 3 where K = 4..7 paid; learnt from the run's passes it widens."""
    curve = [0.130, 0.125, 0.124, 0.126, 0.134, 0.138, 0.138, 0.140, 0.144] + [0.17] * 8

    def k_after(steps: int, per_pass: float = 0.016) -> int:
        policy = AdaptiveK()
        policy.set_costs(curve, 0.024)
        for _ in range(steps):  # 4 drafts of every 5 accepted: a step keeps up to 4
            k = policy.next_k()
            a = min(k, 4)
            policy.update(Event([0] * (a + 1), ["accepted"] * a + ["bonus" if a == k else "corrected"], k, k,
                                a, per_pass * (k + (a == k)), curve[k], 0.0))
        return policy.next_k()

    assert k_after(0) <= 3
    assert k_after(40) > k_after(40, per_pass=0.024)  # the control: passes as slow as the probe


def test_a_run_of_known_length_explores_from_its_first_step():
    """torch bf16 -> torch bf16 at T = 1 in results/anatomy_auto: plain decoding 141 ms per token, a
    verify pass 136 ms, a draft pass 54 ms. At the Beta(2, 2) prior no K is expected to pay, and a
    budget of 3% of the time decoded so far allows no try for the first seconds of a run; told the
    run's length, the policy spends 3% of the whole run on trying from its first step, and a run
    whose every draft is rejected still ends within that 3% of plain decoding."""
    costs = ([0.141] + [0.136] * 16, 0.054)

    def first_k(**kw) -> int:
        policy = AdaptiveK(**kw)
        policy.set_costs(*costs)
        return policy.next_k()

    assert first_k() == 0  # the control: an unknown length
    assert first_k(horizon=64) >= 1
    policy = AdaptiveK(horizon=64)
    policy.set_costs(*costs)
    n = seconds = tried = 0
    while n < 64:
        k = policy.next_k()
        tried += k > 0
        ev = Event([0], ["corrected" if k else "target"], k, k, 0, 0.054 * k, costs[0][k], 0.0)
        policy.update(ev)
        n, seconds = n + 1, seconds + ev.t_draft + ev.t_target
    assert tried >= 1 and seconds <= 64 * 0.141 * 1.03
    # Pair hands the run's max_tokens to the policy it makes for k="auto"
    assert Pair.load("synthetic", "synthetic").timed_auto_policy(max_tokens=64).horizon == 64


def test_a_stalled_t1_probe_is_timed_again():
    """A busy machine stalls the probe of T(1) to 10x: plain decoding then looks slow and every K
    looks paying, and while the policy drafts T(1) is never timed again. The run's wider passes,
    timed at a fraction of that T(1), put it in doubt; one plain step times it, and the policy
    stops drafting where drafting loses (a draft pass of 0.8 ms, half of the drafts accepted,
    against a one-token pass of 1 ms). Control, the check switched off: 0.59x of plain."""
    truth = [1e-3 * (1 + 0.3 * n) for n in range(17)]  # seconds, widths 1..17
    rng = np.random.default_rng(0)

    def run(doubt: bool) -> tuple[float, list[int]]:
        policy = AdaptiveK(horizon=400)
        policy.set_costs([10e-3] + truth[1:], 0.8e-3)
        if not doubt:
            policy._t1_stalled = lambda: False
        n = seconds = 0.0
        while n < 400:
            k = policy.next_k()
            a = 0
            while a < k and rng.random() < 0.5:
                a += 1
            kinds = ["accepted"] * a + ["bonus" if a == k else "corrected"] if k else ["target"]
            ev = Event([0] * (a + 1), kinds, k, k, a, 0.8e-3 * (k + (0 < a == k)), truth[k], 0.0)
            policy.update(ev)
            n, seconds = n + a + 1, seconds + ev.t_draft + ev.t_target
        return 400 * 1e-3 / seconds, policy.history  # speedup over plain decoding

    speedup, history = run(doubt=True)
    assert speedup >= 0.95 and 0 in history[:10]
    assert run(doubt=False)[0] < 0.8  # the control: never timed again, it drafts at a loss


def test_pass_costs_are_kept_between_runs(monkeypatch, tmp_path):
    """k="auto" measures the pair's pass costs once per machine, target, draft and options (seconds
    on a 1.5B model, more than a short run's decoding) and later runs start from the kept costs; a
    malformed entry is measured again and rewritten whole; a cache that cannot be written costs
    only the keeping."""
    import json

    from specmac.core import calibration

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    calls = []
    real = calibration.pass_costs
    monkeypatch.setattr(calibration, "pass_costs",
                        lambda *a, **kw: calls.append(kw.get("repeats", 1)) or real(*a, **kw))
    pair = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 1})
    first = adaptive_policy(pair.target, pair.drafter.backend)
    second = adaptive_policy(pair.target, pair.drafter.backend)
    assert calls == [3] and not first.calibration_cached and second.calibration_cached  # kept: 3 sweeps
    assert np.array_equal(first.prior, second.prior) and first.costs.prior_draft == second.costs.prior_draft
    assert second.info()["calibration_cached"] is True
    other = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 2})
    adaptive_policy(other.target, other.drafter.backend)
    assert len(calls) == 2  # other options: measured, not taken from the first pair's
    entries = sorted(calibration.costs_dir().glob("*.json"))
    kept = [f for f in entries if not f.name.startswith("curve-")]  # each pair's entry; each target's curve
    assert len(kept) == 2 and len(entries) == 4
    assert not list(calibration.costs_dir().glob(".*"))  # no temporary left
    for f in kept:
        f.write_text('{"t_target": [1.0')
    third = adaptive_policy(pair.target, pair.drafter.backend)
    # the pair's entry is made again, from the target's kept curve (no new probe)
    assert len(calls) == 2 and not third.calibration_cached and np.array_equal(third.prior, first.prior)
    def whole(f) -> bool:
        try:
            return len(json.loads(f.read_text())["t_target"]) == 17
        except ValueError:
            return False

    assert [whole(f) for f in kept].count(True) == 1  # this pair's entry, rewritten; the other's not
    assert adaptive_policy(pair.target, pair.drafter.backend).calibration_cached  # rewritten whole
    # a model draft's entry and a free draft's (another k_max) share the target's curve
    free = adaptive_policy(pair.target, None, k_max=8)
    assert len(calls) == 2 and np.array_equal(free.prior[1:10], first.prior[1:10])
    adaptive_policy(pair.target, None, k_max=32)  # wider than the kept curve: probed again
    assert calls == [3, 3, 3]
    assert len(json.loads(calibration._curve_entry(pair.target)[1].read_text())["t_target"]) == 33
    for f in calibration.costs_dir().glob("*.json"):
        f.write_text("{")
    adaptive_policy(pair.target, pair.drafter.backend)
    assert len(calls) == 4  # a malformed curve is probed again
    adaptive_policy(pair.target, pair.drafter.backend, cache=False)
    assert len(calls) == 5 and calls[-1] == 1  # for this run only: one sweep, the run refines it
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "file"))  # cannot hold a folder
    unkept = adaptive_policy(pair.target, pair.drafter.backend)
    assert unkept.prior is not None and not unkept.calibration_cached and len(calls) == 6


def test_one_slow_step_does_not_shift_every_width():
    """The run's residual against the measured curve (the loop's overhead, a slower machine) is the
    median of its recent steps': one step stalled by 2 s (a page fault, a preemption) among steps 1
    ms over the curve moves no width it did not time. Were it the mean (of the 11 steps after the
    first, which is not counted), every such width would cost about 2 s / 11 more: a curve of
    10-26 ms read as flat, where the widest costs hardly more than one token. A machine that slows
    for good (20 ms a step) moves every width within 9 steps."""
    from types import SimpleNamespace

    from specmac.core.estimate import CostEstimator

    truth = np.array([10e-3 * (1 + 0.1 * n) for n in range(17)])  # T(n) for n = 1..17

    def step(est, d, extra):
        est.observe(SimpleNamespace(n_drafted=d, n_accepted=d, t_draft=1e-3 * d,
                                    t_target=float(truth[d]) + extra, t_other=0.0))

    est = CostEstimator()
    est.set_costs(list(truth), 1e-3)
    for i in range(12):  # widths 4 and 6 only; the second step stalls
        step(est, 3 if i % 2 else 5, 2.0 if i == 1 else 1e-3)
    curve = est.curve()
    for n in (1, 2, 9, 17):  # widths the run did not time
        assert curve[n] == pytest.approx(truth[n - 1] + 1e-3, abs=1e-4), n
    assert curve[17] / curve[1] > 2.0  # the curve's shape stands

    for _ in range(9):  # the machine now 20 ms slower a step
        step(est, 3, 20e-3)
    assert est.curve()[9] == pytest.approx(truth[8] + 20e-3, abs=1e-4)


def test_the_kept_costs_check_costs_one_pass_after_a_run(monkeypatch, tmp_path):
    """Every k="auto" run checks the kept T(1) against a one-token pass timed now. After a run the
    target holds that run's context, its weights paged in, so the check is one pass after it,
    rewound, and the run's prompt is the only prefill. It used to prefill probe tokens first: 270 ms
    on the 1.5B Q4_K_M file here, 3% of a 96-token rag answer's end-to-end time. A fresh target
    is still prefilled first (control), and the rewound context scores as before the check."""
    from specmac.core import calibration

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path / "cache"))
    pair = Pair.load("synthetic", "lookup", target_options={"latency_ms": 1})
    target = pair.target
    pair.generate("the cat sat on the mat and the cat sat", max_tokens=8, k="auto")  # measures, keeps
    calls: list[str] = []
    for name in ("prefill", "score"):
        real = getattr(target, name)
        monkeypatch.setattr(target, name, lambda ids, real=real, name=name: calls.append(name) or real(ids))
    held = target.n_past
    before = target.score([5])
    target.rewind(held)
    calls.clear()
    assert held > 0 and calibration.fresh_t1(target) > 0
    assert calls == ["score"] and target.n_past == held
    assert np.array_equal(target.score([5]), before)  # the context is as it was
    calls.clear()
    pair.generate("the cat sat on the mat and the cat sat", max_tokens=8, k="auto")
    assert calls.count("prefill") == 1  # the prompt's; the check is one pass after the last run
    target.reset()
    calls.clear()
    calibration.fresh_t1(target)
    assert calls[0] == "prefill" and target.n_past == 0  # a fresh target: prefilled first
