"""The step planner: each step's source and width, from one record per sequence and one cost model.

Checked against hand-computed numbers and exact formulas (the record), simulated runs against the
best fixed K (the choice), and the real loop on the synthetic pair (sources, prefill, greediness).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specmac.api import Pair
from specmac.core.costs import K_MAX, Costs, best_k
from specmac.core.drafters import Drafter
from specmac.core.planner import HOLD, LENGTH, SETTLED_WEIGHT, Planner
from specmac.core.sampling import SamplingParams
from specmac.core.sources import split_draft
from specmac.errors import BadOption

GREEDY = SamplingParams(0.0)


class Model(Drafter):
    """A stand-in model source: the planner reads only its name, its backend's presence, its priors."""

    name = "m"
    backend = object()

    def __init__(self, prior=(0.6, 4.0, True)) -> None:
        self.priors = {"model": prior}


class Free(Drafter):
    """A stand-in free source with a kind of match ("x") and a guess ("g")."""

    name = "free"
    priors = {"x": (0.5, 2.0, False), "g": (0.4, 8.0, False)}
    guesses = ("g",)


def curve(t1: float, beta: float, n: int = 17) -> list[float]:
    return [t1 * (1 + beta * (w - 1)) for w in range(1, n + 1)]


# --- the record --------------------------------------------------------------------------------

def record_of(max_tokens: int, priors: dict):
    """A sequence's record under a planner of no sources whose priors are ``priors``."""
    planner = Planner([])
    planner.priors = priors
    return planner.record(max_tokens)


def test_a_models_survival_is_its_beta_posterior():
    """One rate: S(j) = E[alpha^j] under Beta(a, b), a and b the prior's plus the pooled accepted
    drafts and rejections; Beta(1, 1) gives 1 / (j + 1), and uncertainty makes long runs likelier
    than the mean's alpha^j (alpha^j is convex)."""
    r = record_of(100, {("m", "model"): (0.5, 2.0, True)})
    assert r.survival(("m", "model"), 6) == pytest.approx([1 / (j + 1) for j in range(7)], rel=1e-12)
    r.learn(("m", "model"), [1, 2, 3, 4], [1, 2, 3, 9])  # 3 accepted, rejected at the 4th
    r.learn(("m", "model"), [1, 2], [1, 2, 5])  # 2 accepted, the bonus
    a, b = 1 + 5, 1 + 1
    want = [math.prod((a + i) / (a + b + i) for i in range(j)) for j in range(9)]
    assert r.survival(("m", "model"), 8) == pytest.approx(want, rel=1e-12)
    assert (r.survival(("m", "model"), 8)[2:] > (a / (a + b)) ** np.arange(2, 9)).all()


def test_a_free_kinds_survival_is_counted_by_depth():
    """Run lengths: depth j's share is its own counts shrunk towards the share before it (the prior
    p before the first), with the prior's weight; a depth no proposal reached leans on the one before."""
    r = record_of(100, {("f", "x"): (0.5, 2.0, False)})
    r.learn(("f", "x"), [1, 2, 3], [1, 2, 9])  # reached depths 1..3, accepted 1..2
    s0 = (1 + 2 * 0.5) / (1 + 2)
    s1 = (1 + 2 * s0) / (1 + 2)
    s2 = (0 + 2 * s1) / (1 + 2)
    assert r.survival(("f", "x"), 4) == pytest.approx([1, s0, s0 * s1, s0 * s1 * s2, s0 * s1 * s2 * s2])


def test_the_text_says_nothing_beyond_what_it_committed():
    """A proposal is accepted as far as it agrees with the committed tokens and rejected at the first
    difference; past the committed tokens (EOS, a plain step's one token) nothing is known."""
    r = record_of(100, {})
    r.learn(("f", "x"), [1, 2, 3, 4], [1, 2])  # agreed on both: censored at depth 2
    assert r.reached[("f", "x")].tolist() == [1, 1] and r.accepted[("f", "x")].tolist() == [1, 1]
    r.learn(("f", "x"), [5, 6], [1])  # the first differs: a rejection at depth 1
    assert r.reached[("f", "x")].tolist() == [2, 1] and r.accepted[("f", "x")].tolist() == [1, 1]
    r.advance(3, 2)  # a step: every count fades
    assert r.reached[("f", "x")].tolist() == pytest.approx([1.94, 0.97])
    assert (r.n_out, r.free_written) == (3, 2)


def test_a_new_sequence_starts_from_what_the_sequences_done_showed():
    """The planner's sequences done move a new one's prior share: a free kind's by its proposals'
    first drafts (its own prior counting for its weight), a model's by all its drafts (its own
    counting for SETTLED_WEIGHT of them); at the source's own weight, so the new sequence still
    learns its own text; each done sequence counts once, the earlier ones fading by KEEP."""
    planner = Planner([])
    planner.priors = {("f", "x"): (0.5, 2.0, False), ("m", "model"): (0.6, 4.0, True)}
    first = planner.record(100)
    for _ in range(40):  # forty proposals, each rejected at its first draft
        first.learn(("f", "x"), [1, 2, 3], [9])
    first.learn(("m", "model"), [1, 2, 3, 4], [1, 2, 3, 9])  # 3 of 4 drafts accepted
    first.advance(1, 0)  # the decayed counts fade; what the planner keeps does not
    assert planner.record(100).survival(("f", "x"), 1)[1] == pytest.approx(0.5)  # not done yet
    planner.settle(first)
    planner.settle(first)  # once
    second = planner.record(100)
    w = SETTLED_WEIGHT
    assert second.priors[("f", "x")] == (pytest.approx((0 + 0.5 * 2) / (40 + 2)), 2.0, False)
    assert second.priors[("m", "model")] == (pytest.approx((3 + 0.6 * w) / (4 + w)), 4.0, True)
    assert second.priors[("m", "model")][0] > 0.6  # four drafts move it a little
    assert second.survival(("f", "x"), 1)[1] < 0.05
    for _ in range(2):
        second.learn(("f", "x"), [1, 2], [1, 2, 3])  # its own text copies: it learns that quickly
    assert second.survival(("f", "x"), 1)[1] > 0.5
    planner.settle(second)
    third = planner.record(100)
    a, n = 0.8 * 0 + 2, 0.8 * 40 + 2
    assert third.priors[("f", "x")][0] == pytest.approx((a + 0.5 * 2) / (n + 2))
    # the second never drafted with the model: what the first showed of it (3 of 4, above its prior)
    # is kept, not faded; shown below its prior, it fades towards it, so the model is tried again
    assert third.priors[("m", "model")] == second.priors[("m", "model")]
    planner.done.counts[("m", "model")] = np.array([0.0, 8.0])
    low = planner.record(100).priors[("m", "model")][0]
    planner.settle(planner.record(100))
    assert low < planner.record(100).priors[("m", "model")][0] < 0.6


def test_a_new_sequence_expects_the_lengths_and_the_share_the_sequences_done_showed():
    """Answers that ran to their max_tokens make the next one expect to run on (the prior alone
    expects some to end early); answers that ended early make it expect less; the share of the text
    free sources wrote moves the next one's share a model can draft for, from 0.5 before any."""
    def done(n_out: int, free: int, max_tokens: int = 64) -> Planner:
        planner = Planner([])
        for _ in range(5):
            r = planner.record(max_tokens)
            r.advance(n_out, free)
            planner.settle(r)
            planner.settle(r)  # once
        return planner

    fresh = Planner([]).record(64)
    assert fresh.length == LENGTH and fresh.model_share(True) == 0.5
    fresh.advance(7, 0)
    long, short = done(64, 4).record(64), done(8, 6).record(64)
    assert long.model_share(True) > 0.9 and short.model_share(True) < 0.35
    long.advance(7, 0)
    short.advance(7, 0)
    assert short.left() < fresh.left() < long.left() < 64 - 7
    assert long.left() - fresh.left() > 0.35 * (64 - 7 - fresh.left())  # a good way to the limit
    assert done(64, 4).done.lengths[0][0] == pytest.approx(0.8 ** 4)  # each done once, the earlier fading


def test_a_stream_settles_its_record_with_its_planner_when_it_closes():
    """``Stream.close`` hands the record to its planner: a server's next request starts from it."""
    pair = Pair.load("synthetic", "lookup")
    planner = pair.planner(4)
    ids = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    events = list(pair.stream(ids, max_tokens=24, params=GREEDY, k=planner))
    assert events and planner.last.settled and planner.done.counts
    assert set(planner.done.counts) <= set(planner.priors)


def test_the_tokens_left_are_the_heavy_tailed_expectation():
    """E[min(L, max_tokens) - n | L > n] for P(L > x) = c / (c + x), integrated numerically."""
    for m, n in ((96, 0), (96, 40), (4096, 0), (4096, 1000)):
        r = record_of(m, {})
        r.n_out = n
        x = np.linspace(n, m, 200001)
        want = np.trapezoid((LENGTH + n) / (LENGTH + x), x)
        assert r.left(LENGTH) == pytest.approx(want, rel=1e-6)
        assert r.left(LENGTH) < m - n
    r.n_out = r.max_tokens
    assert r.left(LENGTH) == 0.0


# --- choosing a model's K ----------------------------------------------------------------------

def simulate(planner: Planner | int, *, alpha, t_d, t_target, steps, seed=0, room=16):
    """A model source whose every draft is accepted with probability alpha, on step costs
    ``t_target(n)``; a planner chooses K (an int: that fixed K). -> (tokens per second, the Ks)."""
    rng = np.random.default_rng(seed)
    record = planner.record(steps) if isinstance(planner, Planner) else None
    tokens = seconds = 0.0
    ks, behind = [], 1
    for _ in range(steps):
        if isinstance(planner, Planner):
            src, k = planner.choose(record, [], {0: behind}, room)
        else:
            src, k = (0 if planner else None), planner
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        drafts, committed = [1] * k, [1] * a + [2]
        t_draft, t_step = t_d * (k + (behind == 2 and k > 0)), t_target(k + 1)
        if isinstance(planner, Planner):
            planner.observe(record, [], (src, k), drafts, committed, behind, t_draft, t_step)
        behind = 2 if (k and a == k) else 1 if k else behind + 1
        tokens, seconds = tokens + a + 1, seconds + t_draft + t_step
        ks.append(k)
    return tokens / seconds, ks


@pytest.mark.parametrize("alpha,t_d,beta", [(0.9, 0.05, 0.05), (0.6, 0.2, 0.1), (0.8, 0.02, 0.6),
                                            (0.3, 0.5, 0.0), (0.95, 0.1, 1.0)])
def test_auto_matches_the_best_fixed_k(alpha, t_d, beta):
    def t(n):
        return 1.0 + beta * (n - 1)

    rates = {k: simulate(k, alpha=alpha, t_d=t_d, t_target=t, steps=600)[0] for k in range(17)}
    planner = Planner([Model()], Costs(curve(1.0, beta), {"m": t_d}))
    auto, ks = simulate(planner, alpha=alpha, t_d=t_d, t_target=t, steps=600)
    assert auto >= 0.93 * max(rates.values())
    k_star, s_star = best_k(alpha, t_d, t)
    k_star = k_star if s_star > 1.0 else 0
    settled = np.bincount(ks[-200:]).argmax()
    assert abs(settled - k_star) <= 1 or rates[settled] >= 0.97 * rates[k_star]


def test_the_best_width_follows_the_measured_curve_not_a_line():
    """llama.cpp switches kernels with the batch size: a curve that dips at n = 16 is found."""
    def t(n):
        return (1 + 0.8 * (n - 1)) * (0.45 if n >= 16 else 1.0)

    best = max(simulate(k, alpha=0.95, t_d=0.05, t_target=t, steps=400)[0] for k in range(1, 17))
    planner = Planner([Model()], Costs([t(n) for n in range(1, 18)], {"m": 0.05}))
    auto, ks = simulate(planner, alpha=0.95, t_d=0.05, t_target=t, steps=400)
    assert auto >= 0.9 * best and np.bincount(ks[-100:]).argmax() >= 15


def test_a_width_not_measured_is_never_chosen():
    planner = Planner([Model((0.99, 100.0, True)), Free()], Costs([1.0] * 5, {"m": 0.0}))
    record = planner.record(1000)
    assert planner.choose(record, [], {0: 1}, 16)[1] <= 4
    assert planner.choose(record, [(1, list(range(30)), "x")], {}, 30)[1] <= 4


def test_when_nothing_pays_it_stops_drafting_and_tries_again_later():
    """Rejections make every K a loss: a plain step. The counts fade every step, and once the record
    has faded towards its prior a model is tried again; a run of acceptances keeps it on."""
    planner = Planner([Model()], Costs(curve(1.0, 0.3), {"m": 0.1}))
    record = planner.record(10**6)
    assert planner.choose(record, [], {0: 1}, 16)[0] == 0
    for _ in range(12):
        k = planner.choose(record, [], {0: 1}, 16)[1] or 2
        planner.observe(record, [], (0, k), [1] * k, [2], 1, 0.1 * k, 1.0 + 0.3 * k)
    assert planner.choose(record, [], {0: 1}, 16) == (None, 0)
    off = 0
    while planner.choose(record, [], {0: 1 + off}, 16)[0] is None:
        planner.observe(record, [], (None, 0), [], [3], 1 + off, 0.0, 1.0)
        off += 1
        assert off < 400, "never drafts again"
    assert off > 5  # not on the next step: a run of rejections is evidence
    for _ in range(20):
        src, k = planner.choose(record, [], {0: 1}, 16)
        planner.observe(record, [], (src, k), [1] * k, [1] * k + [2], 2, 0.1 * k, 1.0 + 0.3 * k)
    assert planner.choose(record, [], {0: 2}, 16)[1] >= 2


def test_one_rejected_first_step_does_not_switch_a_paying_draft_off():
    """A verify pass cheaper than a plain step and a draft pass a third of it: one fully rejected
    first step leaves a prior of four drafts still drafting; a prior of one (control) stops."""
    def after_one_rejection(prior) -> int:
        planner = Planner([Model(prior)], Costs([0.155] + [0.135] * 16, {"m": 0.054}))
        record = planner.record(10**6)
        src, k = planner.choose(record, [], {0: 1}, 16)
        assert src == 0
        planner.observe(record, [], (0, k), [1] * k, [2], 1, 0.054 * k, 0.135)
        record.lost = 1e9  # no budget for a try: the choice at the mean alone
        return planner.choose(record, [], {0: 1}, 16)[1]

    assert after_one_rejection((0.6, 4.0, True)) >= 1
    assert after_one_rejection((0.5, 1.0, True)) == 0


def test_the_run_corrects_a_slow_draft_probe():
    """The draft's pass timed at 24 ms right after the target's sweep, 16 ms in the run: learnt
    from the run's passes the planner widens K; a run as slow as the probe (control) does not."""
    c = [0.130, 0.125, 0.124, 0.126, 0.134, 0.138, 0.138, 0.140, 0.144] + [0.17] * 8

    def k_after(steps: int, per_pass: float = 0.016) -> int:
        planner = Planner([Model()], Costs(c, {"m": 0.024}))
        return simulate(planner, alpha=0.8, t_d=per_pass, t_target=lambda n: c[min(n, 17) - 1], steps=steps,
                        seed=1)[1][-1]

    assert k_after(200) > k_after(200, per_pass=0.024)


# --- a model's prefill, and free sources beside it -------------------------------------------------

def prefill_planner(free: bool = False) -> Planner:
    """A target of 176 ms a pass about flat in width, a draft pass of 40 ms, a prefill of 5 ms a token."""
    sources = [Model(), Free()] if free else [Model()]
    return Planner(sources, Costs([0.176 * (1 + 0.02 * n) for n in range(17)], {"m": 0.040}, {"m": 0.005}))


def test_a_long_prompt_with_a_short_answer_keeps_the_model_off():
    """A prefill of 718 tokens (3.6 s) against what the model saves over the tokens the answer can
    be expected to have left: not started for a 96-token budget, and the record says why; started
    where the answer may run long (4096) or the prompt is short."""
    planner = prefill_planner()
    short = planner.record(96)
    assert planner.choose(short, [], {0: 718}, 95) == (None, 0)
    assert short.note.startswith("model draft not started: its prefill of 718 tokens")
    assert "exceeds" in short.note
    assert planner.choose(planner.record(4096), [], {0: 718}, 95)[0] == 0
    assert planner.choose(planner.record(96), [], {0: 60}, 95)[0] == 0


def test_the_note_says_why_not_as_of_the_latest_step():
    """The note of why the model is not started follows the sequence: once the same prefill pays
    (the answer may run long), it is gone, not left saying the model was not started."""
    planner = prefill_planner()
    record = planner.record(96)
    assert planner.choose(record, [], {0: 718}, 95) == (None, 0)
    assert record.note.startswith("model draft not started")
    record.max_tokens = 4096
    assert planner.choose(record, [], {0: 718}, 95)[0] == 0
    assert record.note == ""


def test_the_prefill_is_paid_back_only_over_what_the_model_would_draft():
    """Beside a lookup that wrote most of the text (a code edit), the model's prefill is spread over
    the few tokens left to it; the same text written by plain steps starts it. (A run of 200 tokens:
    its budget for a try, 3% of the time left, is less than the prefill.)"""
    planner = prefill_planner(free=True)
    copied = planner.record(200)
    copied.n_out, copied.free_written = 60, 55
    assert planner.choose(copied, [], {0: 300}, 95) == (None, 0)
    plain = planner.record(200)
    plain.n_out = 60
    assert planner.choose(plain, [], {0: 300}, 95)[0] == 0


def test_beside_free_sources_a_costly_prefill_waits_a_few_tokens():
    """The free sources are tried for the first ``HOLD`` tokens before a prefill dearer than as
    many plain steps is paid (a text they copy would not pay it back); alone, the model starts."""
    planner = prefill_planner(free=True)
    record = planner.record(4096)
    assert planner.choose(record, [], {0: 300}, 95) == (None, 0)
    record.n_out = HOLD
    assert planner.choose(record, [], {0: 300}, 95)[0] == 0
    assert prefill_planner().choose(prefill_planner().record(4096), [], {0: 300}, 95)[0] == 0


def test_a_guess_does_not_take_a_step_from_a_started_model_that_pays():
    """A weak match (a guess) is bet on against a plain step only, never against a started model
    that beats a plain step; a match of another kind with the same numbers still competes."""
    planner = Planner([Model((0.7, 4.0, True)), Free()],
                      Costs([1.0 + 0.01 * n for n in range(33)], {"m": 0.2}))
    record = planner.record(10**6)
    record.n_out = 10
    guess = (1, [5, 6, 7, 8], "g")
    assert planner.choose(record, [guess], {0: 2}, 16)[0] == 0  # started and paying: the model
    record.priors = {**planner.priors, ("free", "x"): (0.4, 8.0, False)}
    assert planner.choose(record, [(1, [5, 6, 7, 8], "x")], {0: 2}, 16)[0] == 1  # not a guess: it wins
    assert planner.choose(record, [guess], {0: 500}, 16)[0] == 1  # a model not started: it competes


def test_the_choice_follows_costs_and_acceptance():
    planner = Planner([Model(), Free()], Costs([1.0 + 0.01 * n for n in range(33)], {"m": 0.05}))
    record = planner.record(10**6)
    record.n_out = 10
    offer = [(1, list(range(20)), "x")]
    for _ in range(20):  # the lookup's matches accepted whole
        record.learn(("free", "x"), list(range(20)), list(range(20)))
    assert planner.choose(record, offer, {0: 1}, 32)[0] == 1
    for _ in range(60):  # now rejected at their first draft
        record.learn(("free", "x"), [1], [2])
        record.advance(1, 0)
    assert planner.choose(record, offer, {0: 1}, 32)[0] == 0


# --- a fixed K, and a batch ---------------------------------------------------------------------

def test_a_fixed_k_is_the_users_width():
    """One model and a fixed K: K every step, whatever it costs. One free source: its proposal up to
    K where its first draft is as likely accepted as not (a weak match's prior, 0.4, is not bet
    on). Several sources: the one with the most tokens per second, a model only once a step was
    timed (its seconds cannot be weighed before)."""
    model = Planner([Model()], Costs(curve(1.0, 1.0), {"m": 10.0}), k=3)
    assert model.choose(model.record(100), [], {0: 500}, 16) == (0, 3)
    free = Planner([Free()], k=3)
    record = free.record(100)
    assert free.choose(record, [(0, [1, 2, 3, 4, 5], "x")], {}, 16) == (0, 3)
    assert free.choose(record, [(0, [1, 2, 3, 4, 5], "g")], {}, 16) == (None, 0)
    both = Planner([Model(), Free()], Costs(t_draft={"m": 0.01}), k=4)
    record = both.record(100)
    assert both.choose(record, [], {0: 1}, 16) == (None, 0)  # nothing timed: no model yet
    both.observe(record, [], (None, 0), [], [1], 1, 0.0, 1.0)
    assert both.choose(record, [], {0: 1}, 16) == (0, 4)


def test_a_batch_of_one_is_one_sequence_and_a_batch_shares_the_cheap_width():
    """``plan`` gives one sequence what ``choose`` gives it; sequences in one pass share the width
    that is cheap (here the first 4 tokens), so drafts shrink as the batch fills it, and with 4
    sequences there is no cheap width left to draft into."""
    def t(n):
        return 1.0 if n <= 4 else 1.0 + 0.4 * (n - 4)

    planner = Planner([Free()], Costs([t(n) for n in range(1, 34)]))
    records = [planner.record(1000) for _ in range(4)]
    for r in records:
        for _ in range(10):
            r.learn(("free", "x"), [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])
    offer = [(0, [1, 2, 3, 4, 5, 6, 7, 8], "x")]
    alone = planner.choose(records[0], offer, {}, 16)
    assert planner.plan([(records[0], offer, {}, 16)]) == [alone] and alone[1] >= 3
    two = planner.plan([(r, offer, {}, 16) for r in records[:2]])
    assert sum(w for _, w in two) + 2 <= 4 + 1 and sum(w for _, w in two) < 2 * alone[1]
    four = planner.plan([(r, offer, {}, 16) for r in records])
    assert all(w == 0 for _, w in four)


def test_a_batch_is_priced_by_the_forwards_the_target_makes():
    """A target that would pad its lanes to the longest scores one stream's drafts beside the
    others' single tokens in a second forward: priced by the backend's ``forwards``, a draft that
    pays in one forward over all the tokens is declined where it costs a forward of its own."""
    planner = Planner([Free()], Costs([1.0 + 0.02 * n for n in range(33)]))
    records = [planner.record(1000) for _ in range(4)]
    for _ in range(10):
        records[0].learn(("free", "x"), [1, 2, 3, 4], [1, 2, 3, 4])
    asks = [(records[0], [(0, [1, 2, 3, 4], "x")], {}, 16)] + [(r, [], {}, 16) for r in records[1:]]
    one = planner.plan(asks)
    assert one[0][0] == 0 and one[0][1] >= 2 and all(c == (None, 0) for c in one[1:])

    def padded(widths):  # padding to the longest, like widths together: the long ask alone
        return [sum(widths)] if len(set(widths)) == 1 else [max(widths), sum(widths) - max(widths)]

    assert planner.plan(asks, padded) == [(None, 0)] * 4


def test_a_model_drafting_for_several_sequences_is_priced_at_its_pass_for_that_many():
    """Four sequences on one model that drafts for all of them in each of its passes: where such a
    pass was timed at what one sequence's costs, the plan drafts for all four, at the one K that
    pays best for all (one draft each: two would widen the pass past its cheap 8 tokens); where the
    run timed it at four times that (sharing saves nothing), fewer of them share the model's
    passes; before any such pass is timed, each sequence's lane costs a pass of its own (nothing
    saved by sharing is assumed)."""
    class Batching(Model):
        backend = type("Lanes", (), {"can_batch": True})()

    def plan(wide: float | None) -> list:
        costs = Costs([1.0] * 8 + [1.0 + 0.1 * n for n in range(1, 26)], {"m": 0.12}, {"m": 0.0})
        if wide is not None:
            costs.observe_draft("m", 50, 50 * wide, lanes=4)
        planner = Planner([Batching()], costs)
        records = [planner.record(1000) for _ in range(4)]
        for r in records:
            for _ in range(10):
                r.learn(("m", "model"), [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9])
        return planner.plan([(r, [], {0: 1}, 16) for r in records])

    cheap, dear, untimed = plan(0.12), plan(0.48), plan(None)
    assert cheap == [(0, 1)] * 4
    assert sum(src == 0 for src, _ in dear) <= 2
    assert sum(src == 0 for src, _ in untimed) <= 2


def test_a_try_in_a_batch_pays_at_the_passs_rate():
    """Where nothing pays at the means, a sequence alone tries the model at an optimistic
    acceptance; beside three others in one pass, the same try delays all four for a draft that
    would not pay the pass back even at that acceptance, and is not made."""
    costs = Costs([1.0] * 8 + [1.0 + 0.15 * n for n in range(1, 26)], {"m": 0.3}, {"m": 0.0})
    planner = Planner([Model((0.2, 4.0, True))], costs)
    records = [planner.record(1000) for _ in range(4)]
    assert planner.plan([(records[0], [], {0: 1}, 16)])[0][0] == 0  # alone: tried
    assert planner.plan([(r, [], {0: 1}, 16) for r in records]) == [(None, 0)] * 4
    records[0].lost = 1e9  # no budget for a try: alone, the choice at the mean is a plain step
    assert planner.plan([(records[0], [], {0: 1}, 16)]) == [(None, 0)]


def test_a_batch_tries_a_shared_model_together_within_its_planners_budget():
    """Four sequences whose model pays only at a higher acceptance than its prior, and only shared
    by all four (alone, one sequence's drafts would delay the pass for three others): the plan tries
    all four on it at once at an optimistic acceptance, where the worst case fits the budget of the
    planner's passes; with that budget spent, all four take plain steps."""
    class Batching(Model):
        backend = type("Lanes", (), {"can_batch": True})()

    def plan(lost: float) -> list:
        costs = Costs([1.0] * 8 + [1.0 + 0.1 * n for n in range(1, 26)], {"m": 0.3}, {"m": 0.0})
        costs.observe_draft("m", 50, 50 * 0.3, lanes=4)  # sharing is free: a pass for four costs one's
        planner = Planner([Batching((0.3, 4.0, True))], costs)
        planner.ledger.lost = lost
        records = [planner.record(1000) for _ in range(4)]
        return planner.plan([(r, [], {0: 1}, 16) for r in records])

    assert plan(0.0) == [(0, 1)] * 4
    assert plan(1e9) == [(None, 0)] * 4


def test_a_batchs_try_drafts_the_cheapest_k_that_beats_the_plan():
    """Four sequences whose shared model pays at no K at its prior (0.3) but at one and two drafts
    each at the optimistic acceptance, two paying most there: the try drafts one each, the K whose
    worst case costs least; it shows the model's acceptance as well, and loses least where the
    prior was right."""
    class Batching(Model):
        backend = type("Lanes", (), {"can_batch": True})()

    costs = Costs([1.0] * 4 + [1.0 + 0.05 * n for n in range(1, 30)], {"m": 0.1}, {"m": 0.0})
    costs.observe_draft("m", 50, 50 * 0.1, lanes=4)  # sharing is free: a pass for four costs one's
    planner = Planner([Batching((0.3, 4.0, True))], costs)
    records = [planner.record(1000) for _ in range(4)]
    assert planner.plan([(r, [], {0: 1}, 16) for r in records]) == [(0, 1)] * 4


def test_a_try_bets_on_no_more_than_the_sequences_done_showed():
    """Eight sequences whose shared model pays at no K at the 0.83 that 200 drafts of the sequences
    done showed (170 accepted, beside the source's own prior; nor at 0.87, that rate's optimistic
    bound), but at every draft accepted: the batch takes plain steps. A prior of the source's own
    weight (four drafts) at 0.83 would bet on 1.0 and try the model on every pass its budget allows
    (planted: the shown drafts ignored)."""
    class Batching(Model):
        backend = type("Lanes", (), {"can_batch": True})()

    costs = Costs([0.2 + 0.016 * n for n in range(1, 40)], {"m": 0.12}, {"m": 0.0})
    costs.observe_draft("m", 50, 50 * 0.12, lanes=8)  # sharing is free: a pass for eight costs one's
    planner = Planner([Batching()], costs)
    planner.done.counts[("m", "model")] = np.array([170.0, 200.0])
    records = [planner.record(1000) for _ in range(8)]
    assert records[0].hopeful(("m", "model"), 1)[1] == pytest.approx(0.87, abs=0.01)
    assert planner.plan([(r, [], {0: 1}, 16) for r in records]) == [(None, 0)] * 8


def test_the_ledger_counts_a_batchs_pass_against_plain_passes_of_the_same_tokens():
    """Four sequences on a shared model, each writing three tokens in a pass of 0.6 s (drafting
    included) where a plain pass of the four takes 0.24 s: the pass gained what twelve tokens at
    0.06 s each take beyond it (0.12 s), counted once; a pass of plain steps, even a slow one,
    is no model's loss."""
    planner = Planner([Model()], Costs([0.2, 0.22, 0.23, 0.24] + [0.3] * 4, {"m": 0.1}, {"m": 0.0}))
    records = [planner.record(100) for _ in range(4)]
    for r in records:
        planner.observe(r, [], (0, 2), [1, 2], [1, 2, 3], 1, 0.2, 0.4, timed=False, shared=True, n_batch=4)
    assert planner.ledger.lost == pytest.approx(-0.12)
    assert planner.ledger.ran == pytest.approx(0.6)
    for r in records:
        planner.observe(r, [], (None, 0), [], [4], 0, 0.0, 0.4, timed=False, n_batch=4)
    assert planner.ledger.lost == pytest.approx(-0.12)
    assert planner.ledger.ran == pytest.approx(1.0)


def test_each_sequence_reads_its_own_text_on_a_model_it_shares():
    """A shared model pass drafts for several sequences at once, but the text each one's lane has
    not seen is read for that lane alone: four sequences starting the model together pay four
    prefills (a plan that counted the dearest one only started all four here)."""
    class Batching(Model):
        backend = type("Lanes", (), {"can_batch": True})()

    costs = Costs([1.0] * 33, {"m": 0.05}, {"m": 0.08})
    costs.observe_draft("m", 50, 50 * 0.05, lanes=4)  # sharing a pass is free here
    planner = Planner([Batching()], costs)
    records = [planner.record(64) for _ in range(4)]
    for r in records:
        for _ in range(3):
            r.learn(("m", "model"), [1, 2, 3, 4], [1, 2, 5])
    assert planner.plan([(records[0], [], {0: 1}, 16)])[0][0] == 0  # started: it pays
    started = planner.plan([(r, [], {0: 1}, 16) for r in records])
    assert all(src == 0 for src, _ in started)  # and pays for all four, sharing its passes
    alone = planner.plan([(records[0], [], {0: 160}, 16)])
    four = planner.plan([(r, [], {0: 160}, 16) for r in records])
    assert alone[0][0] == 0, alone  # one prefill of 160 tokens pays back over the answer
    assert sum(src == 0 for src, _ in four) < 4, four  # four of them in one pass do not


def test_a_width_read_too_dear_does_not_make_a_draft_look_like_a_saving():
    """The probe read T(8) far above the widths after it (a stall in every sweep): beside seven
    other sequences, a model's drafts then seemed to make the pass cheaper, so a draft that would
    not pay its passes back was started (and eight plain steps were never timed, so never learnt
    better). Once the run timed nine twice, a pass over eight costs at most that: no model step pays."""
    probe = [0.3 + 0.02 * n for n in range(1, 34)]
    probe[7] = 0.8
    costs = Costs(probe, {"m": 0.05}, {"m": 0.0})
    for _ in range(2):
        costs.observe(9, probe[8])  # eight plain steps and one draft, timed as probed
    planner = Planner([Model((0.7, 40.0, True))], costs)
    records = [planner.record(1000) for _ in range(8)]
    for r in records:
        r.lost = 1e9  # no budget left for a try: the choice at the means
    assert planner.plan([(r, [], {0: 1}, 16) for r in records]) == [(None, 0)] * 8


# --- the extension --------------------------------------------------------------------------------

def test_a_models_drafts_are_extended_by_a_copied_stretch_where_the_width_is_cheap():
    """After the model drafted: the free source's continuation is verified in the same pass as far
    as it pays at the chance all the model's drafts are accepted; never a guess; not under a fixed
    K; not where the width is dear."""
    planner = Planner([Model((0.9, 40.0, True)), Free()],
                      Costs([1.0 + 0.001 * n for n in range(33)], {"m": 0.05}))
    record = planner.record(10**6)
    for _ in range(10):
        record.learn(("free", "x"), [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])
    ext = planner.extend(record, [(1, [7, 8, 9, 10, 11, 12], "x")], (0, 4), 1)
    assert ext is not None and ext[0] == 1 and len(ext[1]) >= 3
    assert planner.extend(record, [(1, [7, 8, 9], "g")], (0, 4), 1) is None
    dear = Planner(planner.sources, Costs([1.0 + 1.0 * n for n in range(33)], {"m": 0.05}))
    assert dear.extend(record, [(1, [7, 8, 9, 10, 11, 12], "x")], (0, 4), 1) is None
    fixed = Planner(planner.sources, planner.costs, k=4)
    assert fixed.extend(record, [(1, [7, 8, 9], "x")], (0, 4), 1) is None


def test_an_extension_stays_within_the_widths_the_costs_have_seen():
    """Past the measured curve a pass's cost is a guess: a long copied stretch after the model's
    drafts is verified only as far as the widest pass the costs know (here 9 tokens: 4 drafts, 4
    of the stretch and the bonus), and a curve whose last measured step is noise (smaller than the
    ones before it) is not extended by that step."""
    planner = Planner([Model((0.9, 40.0, True)), Free()],
                      Costs([1.0 + 0.001 * n for n in range(9)], {"m": 0.05}))
    record = planner.record(10**6)
    for _ in range(10):
        record.learn(("free", "x"), list(range(40)), list(range(40)))
    ext = planner.extend(record, [(1, list(range(100, 140)), "x")], (0, 4), 1)
    assert ext is not None and 1 <= len(ext[1]) <= 9 - 1 - 4
    assert planner.extend(record, [(1, list(range(100, 140)), "x")], (0, 8), 1) is None
    noisy = Planner(planner.sources, Costs([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.79], {"m": 0.05}))
    wide = noisy.pass_seconds(np.array([9, 20, 60]))
    assert (np.diff(wide) > 0).all() and wide[-1] > 0.79 + 0.08 * 50


def test_a_curve_is_extended_by_its_wider_halfs_slope_not_by_its_last_step():
    """A curve that ends just past a step of its kernel's tiles (here flat to 32 tokens, then a
    jump at 33, as a bf16 matmul's 32-row tiles make one on a CPU) is extended beyond it by the mean
    step of its wider half: the jump is paid once, not again at every width after it, and the
    passes past it still cost more the wider they are."""
    tiles = Planner([Model(), Free()], Costs([1.0] * 32 + [1.5], {"m": 0.05}))
    t33, t40, t64 = (float(x) for x in tiles.pass_seconds(np.array([33, 40, 64])))
    assert t33 == 1.5 and 1.5 < t40 < t64 < 2.5


def test_an_extension_is_learnt_as_its_kind_and_only_where_it_was_reached():
    planner = Planner([Model(), Free()], Costs([1.0] * 9, {"m": 0.01}))
    record = planner.record(100)
    ext = (1, [5, 6], "x")
    # the model's 2 drafts accepted, the extension's first too, its second rejected
    planner.observe(record, [], (0, 2), [1, 2, 5, 6], [1, 2, 5, 9], 1, 0.02, 1.0, ext)
    assert record.reached[("m", "model")].tolist() == pytest.approx([0.97, 0.97])  # a step's fading
    assert record.reached[("free", "x")].tolist() == pytest.approx([0.97, 0.97])
    assert record.accepted[("free", "x")].tolist() == pytest.approx([0.97, 0.0])
    # the model's second draft rejected: the extension was not reached and says nothing
    planner.observe(record, [], (0, 2), [1, 2, 5, 6], [1, 7], 1, 0.02, 1.0, ext)
    assert record.reached[("free", "x")].tolist() == pytest.approx([0.97 ** 2, 0.97 ** 2])


# --- in the loop, on the synthetic pair --------------------------------------------------------

def no_repeated_trigrams(n: int, vocab: int = 47, seed: int = 0) -> list[int]:
    rng, ids, seen = np.random.default_rng(seed), [0, 1], set()
    while len(ids) < n:
        t = int(rng.integers(vocab))
        if (ids[-2], ids[-1], t) not in seen:
            seen.add((ids[-2], ids[-1], t))
            ids.append(t)
    return ids


@pytest.fixture(scope="module")
def slow_prefill():
    """A target of 10 ms a pass at any width, a perfect draft of 1 ms a pass whose prefill grows
    with its tokens (0.3 ms each)."""
    return Pair.load("synthetic", "lookup+synthetic", target_options={"latency_ms": 10, "beta": 0.0},
                     draft_options={"latency_ms": 1, "beta": 0.3, "noise": 0.0})


def test_the_model_is_started_where_the_run_can_win_its_prefill_back(slow_prefill, tmp_path, monkeypatch):
    """A 1000-token prompt the lookup cannot match: a short run decodes plainly (its stats say why),
    a long one starts the model, with a fixed K and with K auto; every text is plain decoding's."""
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    prompt = no_repeated_trigrams(1000)
    for k in (4, "auto"):
        planner = slow_prefill.planner(k)
        short = slow_prefill.generate(prompt, params=GREEDY, max_tokens=8, k=planner)
        assert short.stats.sources.get("synthetic", 0) == 0, k
        assert planner.info()["note"].startswith("model draft not started: its prefill of 10"), k
        long = slow_prefill.generate(prompt, params=GREEDY, max_tokens=400, k=k)
        assert long.stats.sources.get("synthetic", 0) > 0, k
    plain = slow_prefill.plain().generate(prompt, params=GREEDY, max_tokens=400)
    assert long.token_ids == plain.token_ids


def test_run_json_and_text_say_why_the_model_is_not_started(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from specmac.cli import main

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    prompt = "".join(f"{i:x}" for i in range(400))  # 1000+ characters: tokens here
    args = ["run", "--target", "synthetic", "--draft", "synthetic", "--target-opt", "latency_ms=10",
            "--draft-opt", "latency_ms=1", "--draft-opt", "beta=0.3", "--k", "auto", "--max-tokens", "6"]
    res = CliRunner().invoke(main, [*args, "--json", prompt])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["k_policy"]["note"].startswith("model draft not started") and r["n_drafted"] == 0
    res = CliRunner().invoke(main, [*args, prompt])
    assert res.exit_code == 0 and "K choice: model draft not started" in res.output


@pytest.mark.parametrize("draft", ["lookup+synthetic", "ngram+synthetic"])
def test_a_pair_of_sources_records_steps_by_source(draft):
    """"ngram+X" is the n-gram lookup and a model, "lookup+X" the lookup and a model: each step says
    which drafted it, and the text is plain decoding's."""
    pair = Pair.load("synthetic", draft, draft_options={"noise": 0.3})
    text = "abcdefgh" * 8
    g = pair.generate(text, params=GREEDY, k=4, max_tokens=40)
    free = draft.split("+")[0]
    assert [s.name for s in pair.sources] == [free, "synthetic"]
    assert g.stats.sources.get(free, 0) > 0 and sum(g.stats.sources.values()) == g.stats.n_target_passes
    assert g.token_ids == pair.plain().generate(text, params=GREEDY, max_tokens=40).token_ids
    assert pair.info()["draft"]["drafter"] == draft


def test_draft_names_parse_everywhere():
    from specmac.compare.settings import parse_pair

    assert split_draft("lookup+gguf") == ["lookup", "gguf"] and split_draft("gguf") == ["gguf"]
    assert split_draft("none") == [] and split_draft(None) == []
    for bad in ("foo+gguf", "lookup+", "lookup+gguf+mlx", "gguf+lookup", "lookup+ngram"):
        with pytest.raises(BadOption):
            split_draft(bad)
    assert parse_pair("lookup+synthetic:synthetic").draft_backend == "synthetic"
    assert parse_pair("lookup:synthetic").draft == "lookup"
    for bad in ("lookup+nope:synthetic", "foo+synthetic:synthetic", "lookup:lookup"):
        with pytest.raises(BadOption):
            parse_pair(bad)


@pytest.mark.parametrize("draft", ["lookup", "lookup+synthetic", "ngram"])
@pytest.mark.parametrize("k", [3, "auto"])
def test_free_sources_and_pairs_are_seed_exact_under_the_coupled_sampler(draft, k):
    params = SamplingParams(1.0, sampler="coupled")
    prompt = "ab ab ab ab ab ab ab ab"
    pair = Pair.load("synthetic", draft)
    plain = pair.plain().generate(prompt, params=params, max_tokens=48, seed=5).token_ids
    assert pair.generate(prompt, params=params, max_tokens=48, seed=5, k=k).token_ids == plain


def test_auto_goes_wide_over_measured_widths_with_a_prediction(tmp_path, monkeypatch):
    """A prediction is a free source: under k="auto" the target's curve is measured out to K_MAX
    drafts and a perfect prediction is bet on past a model's widest; a model alone measures no wider
    than it may draft."""
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    pair = Pair.load("synthetic", None, target_options={"latency_ms": 3.0, "beta": 0.0})
    prompt = "abc abd abe"
    plain = pair.plain().generate(prompt, params=GREEDY, max_tokens=120)
    pred = pair.prediction_drafter(plain.token_ids)
    planner = pair.planner("auto", [pred])
    assert planner.costs.measured == K_MAX + 1
    out = pair.generate(prompt, params=GREEDY, max_tokens=120, k=planner, prediction=pred)
    assert out.token_ids == plain.token_ids and max(out.stats.k_steps) > 16
    model = Pair.load("synthetic", "synthetic", target_options={"latency_ms": 0.5})
    assert model.planner("auto").costs.measured == 17
