"""Level 2 of the proof and the loop's contract, with the synthetic pair (numpy only).

The synthetic target's next-token logits are known exactly, so the marginal of the token at every
position, of every two neighbouring tokens and the joint first tokens are computable (tests/support/exact.py);
the whole loop is checked against them with K up to 8 and sequences of L = 10 tokens, after a few
prompts, on a vocabulary where the residual max(0, p - q) has several tokens. The planted bugs
these tests must reject are in tests/lossless/test_planted_bugs.py (test_coupled_bugs.py for the
coupled sampler, with which the exact tests run too).
"""

import dataclasses
from collections import Counter

import numpy as np
import pytest
from scipy import stats as sstats

from specmac.api import Pair
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.drafters import Drafter, ModelDrafter, NgramDrafter
from specmac.core.rejection import residual
from specmac.core.sampling import SamplingParams, sample, warp
from tests.support.exact import (
    END,
    PROMPTS,
    L,
    drafting_planner,
    exact_distribution,
    exact_marginals,
    first_acceptance,
    gof,
    level2,
    synthetic_pair,
)


def test_exact_distributions_sum_to_one_and_agree():
    pair = synthetic_pair()
    params = SamplingParams(1.0)
    d = exact_distribution(pair.target, [1, 2], params, 3)
    assert abs(sum(d.values()) - 1) < 1e-12
    assert any(len(s) < 3 for s in d)  # EOS paths are included
    marg, pairs = exact_marginals(pair.target, [1, 2], params, L)
    assert all(abs(sum(m.values()) - 1) < 1e-12 for m in marg + pairs)
    first = Counter()
    for seq, prob in d.items():
        first[seq[0] if seq else END] += prob
    assert all(abs(first[x] - marg[0].get(x, 0)) < 1e-12 for x in set(first) | set(marg[0]))


def test_the_residual_has_several_tokens():
    """Residual bugs are visible only where max(0, p - q) has more than one token."""
    pair = synthetic_pair()
    for prompt in PROMPTS:
        p, q = (warp(b.next_logits(list(prompt))[None], SamplingParams(1.0))[0]
                for b in (pair.target, pair.sources[0].backend))
        assert (residual(p, q) > 0.05).sum() >= 3, prompt


SAMPLERS = ["rejection", "coupled"]  # every exact test runs with both


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7), SamplingParams(1.0, top_k=3),
                                    SamplingParams(1.2, top_p=0.8), SamplingParams(1.0, min_p=0.1)],
                         ids=["t1", "t0.7", "topk3", "topp0.8", "minp0.1"])
def test_loop_matches_exact_distribution(k, params, sampler):
    params = dataclasses.replace(params, sampler=sampler)
    res = level2(synthetic_pair(), params, k, n=500, seed=k)
    assert res["p"] > 1e-3, res


def test_k_reaches_8_within_a_sequence():
    """max_tokens caps K at max_tokens - n_out - 1: with L = 10, K = 8 really drafts 8."""
    pair = synthetic_pair(noise=0.0)
    events = list(pair.stream([1, 2], params=SamplingParams(1.0), max_tokens=L, k=8))
    assert events[0].n_drafted == 8


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_ngram_drafter_is_lossless(sampler):
    target = SyntheticBackend(role="target", vocab_size=6, seed=3, eos_bias=-1.0)
    pair = Pair(target, NgramDrafter())
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]  # the lookup proposes 2, 0, 1, ...
    params = SamplingParams(1.0, sampler=sampler)
    res = level2(pair, params, k=3, n=1500, prompts=[prompt], length=6)
    assert res["p"] > 1e-3, res
    assert pair.generate(prompt, params=params, max_tokens=8, k=3).stats.n_drafted > 0


@pytest.mark.slow
def test_p_values_are_calibrated():
    """Over many seeds, p < 0.05 about 5% of the time and the p-values look uniform."""
    pair = synthetic_pair()
    joint = exact_distribution(pair.target, [4], SamplingParams(1.0), 3)
    pvals = []
    for s in range(60):
        seqs = [tuple(pair.generate([4], params=SamplingParams(1.0), max_tokens=3, k=2,
                                    seed=s * 100_003 + i).token_ids) for i in range(600)]
        pvals.append(gof(Counter(seqs), joint).p_value)
    rejections = sum(p < 0.05 for p in pvals)
    assert rejections <= 9, pvals  # P(Binomial(60, 0.05) > 9) < 0.005
    assert sstats.kstest(pvals, "uniform").pvalue > 1e-3


def lossy_rule(drafts, q, p, rng):
    """Negative control: accept whenever q(d) <= p(d), else sample p afresh (no residual)."""
    for i, d in enumerate(drafts):
        if q[i][d] > p[i][d]:
            return i, sample(p[i], rng)
    return len(drafts), sample(p[len(drafts)], rng)


def test_negative_control_is_rejected_at_the_same_sample_size():
    pair = synthetic_pair()
    assert level2(pair, SamplingParams(1.0), 3, n=500)["p"] > 1e-3
    assert level2(pair, SamplingParams(1.0), 3, n=500, rule=lossy_rule)["p"] < 1e-6


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_equals_greedy_autoregressive(k):
    pair = synthetic_pair(V=40, noise=0.5, eos_bias=-8)
    base = pair.plain()
    greedy = SamplingParams(0.0)
    for prompt in ([1], [5, 6, 7], [30, 2]):
        spec = pair.generate(prompt, params=greedy, max_tokens=40, k=k)
        assert spec.token_ids == base.generate(prompt, params=greedy, max_tokens=40).token_ids
        assert spec.stats.n_drafted > 0


def test_greedy_acceptance_is_complete_when_draft_equals_target():
    pair = synthetic_pair(V=40, noise=0.0, eos_bias=-8)
    g = pair.generate([1], params=SamplingParams(0.0), max_tokens=33, k=4)
    assert g.stats.acceptance_rate == 1.0 and g.stats.n_tokens == 33


def check_caches(pair, seq):
    draft = pair.sources[0]
    assert pair.target.n_past == len(seq) - 1
    assert draft.backend.n_past <= len(seq) - 1
    assert draft.backend.held == list(seq[: draft.backend.n_past])


class ScriptedDrafter(Drafter):
    """A free source that proposes a fixed continuation (one-hot q), e.g. one that contains EOS."""

    name = "scripted"
    priors = {"scripted": (0.9, 2.0, False)}

    def __init__(self, script):
        self.script = script

    def propose(self, seq, k):
        return self.script[len(seq) - self.prompt_len:][:k], "scripted"


def test_eos_inside_an_accepted_draft_stops_there():
    target = SyntheticBackend(vocab_size=12, seed=8, eos_bias=0.0)
    greedy = SamplingParams(0.0)
    # the target's own greedy continuation, with its EOS, as the draft: all accepted up to EOS
    seq, cont = [3], []
    while len(cont) < 30:
        t = int(np.argmax(target.next_logits(seq + cont)))
        cont.append(t)
        if t == target.eos_id:
            break
    assert cont[-1] == target.eos_id and len(cont) >= 2, "pick a seed whose greedy text hits EOS"
    drafter = ScriptedDrafter(cont)
    drafter.prompt_len = 1
    g = Pair(target, drafter).generate(seq, params=greedy, max_tokens=50, k=len(cont) + 2)
    assert g.token_ids == cont[:-1]
    assert g.stats.finish_reason == "eos"
    assert target.n_past == len(seq) + len(g.token_ids) - 1


def test_max_tokens_in_the_middle_of_a_draft_and_k_above_budget():
    pair = synthetic_pair(V=40, noise=0.0, eos_bias=-8)  # everything accepted
    for max_tokens in (1, 2, 5, 7):
        events = list(pair.stream([1, 2], params=SamplingParams(1.0), max_tokens=max_tokens, k=8))
        out = [t for e in events for t in e.tokens]
        assert len(out) == max_tokens
        assert all(e.k <= max_tokens - 1 for e in events)
        assert events[-1].finish_reason == "length"
        check_caches(pair, [1, 2] + out)


def test_context_window_stops_cleanly():
    pair = synthetic_pair(V=40, noise=0.3, eos_bias=-8, n_ctx=16)
    g = pair.generate([1, 2, 3], params=SamplingParams(1.0), max_tokens=100, k=4)
    assert g.stats.finish_reason == "context"
    assert 3 + g.stats.n_tokens == 17  # the cache is full: the last token is emitted, never scored
    assert pair.target.n_past == 16


def test_consumer_stopping_early_leaves_caches_consistent():
    pair = synthetic_pair(V=40, noise=0.8, eos_bias=-8)
    stream = pair.stream([1, 2], params=SamplingParams(1.0), max_tokens=50, k=4, seed=1)
    out = [t for _, e in zip(range(3), stream) for t in e.tokens]
    stream.close()
    check_caches(pair, [1, 2] + out)


class Exploding(SyntheticBackend):
    """Raises KeyboardInterrupt on its n-th score call."""

    def __init__(self, at, **kw):
        super().__init__(**kw)
        self.calls, self.at = 0, at

    def score(self, tokens):
        self.calls += 1
        if self.calls == self.at:
            super().score(tokens)  # the cache has grown when the interrupt lands
            raise KeyboardInterrupt
        return super().score(tokens)


@pytest.mark.parametrize("where", ["target", "draft"])
def test_interrupt_leaves_caches_consistent_and_reusable(where):
    kw = {"vocab_size": 40, "seed": 2, "eos_bias": -8.0}
    target = Exploding(at=4, role="target", **kw) if where == "target" else SyntheticBackend(**kw)
    draft = Exploding(at=6, role="draft", **kw) if where == "draft" else SyntheticBackend(role="draft", **kw)
    pair = Pair(target, ModelDrafter(draft))
    out = []
    with pytest.raises(KeyboardInterrupt):
        for e in pair.stream([1, 2], params=SamplingParams(1.0), max_tokens=60, k=3, seed=4):
            out += e.tokens
    check_caches(pair, [1, 2] + out)
    # the same objects generate exactly what fresh ones do
    again = pair.generate([1, 2], params=SamplingParams(1.0), max_tokens=30, k=3, seed=9)
    fresh = Pair(SyntheticBackend(**kw), ModelDrafter(SyntheticBackend(role="draft", **kw)))
    assert again.token_ids == fresh.generate([1, 2], params=SamplingParams(1.0), max_tokens=30, k=3,
                                             seed=9).token_ids


def test_stats_fall_out_of_the_loop():
    pair = synthetic_pair(V=40, noise=0.6, eos_bias=-8)
    g = pair.generate([1], params=SamplingParams(1.0), max_tokens=64, k=4, seed=0)
    s = g.stats
    assert s.n_tokens == 64 == len(g.token_ids)
    assert s.tokens_per_target_pass == pytest.approx(64 / s.n_target_passes)
    assert s.acceptance_rate == pytest.approx(s.n_accepted / s.n_drafted)
    assert len(s.per_position_acceptance) == 4
    # per-position rates multiply to the observed tokens per pass (up to the clipped last steps)
    assert all(0 <= a <= 1 for a in s.per_position_acceptance)
    assert s.seconds > 0 and s.tokens_per_second > 0


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_acceptance_tracks_the_analytic_rate(sampler):
    """One-position acceptance equals sum_x min(p(x), q(x)) for the first draft position (the
    rejection rule), or the exponential race of the shared noise (rejection.coupled_acceptance)."""
    measured, expected, bound = first_acceptance(synthetic_pair(V=8, noise=0.8, eos_bias=-8), sampler)
    assert abs(measured - expected) < bound, (measured, expected)


def test_auto_k_is_lossless_under_greedy_and_sampling():
    """k="auto" (measured costs) and a planner that drafts at the widths it chooses keep the
    greedy text, and the exact distributions under both samplers."""
    pair = synthetic_pair(V=40, noise=0.5, eos_bias=-8)
    greedy = SamplingParams(0.0)
    want = pair.plain().generate([3, 4], params=greedy, max_tokens=48).token_ids
    assert pair.generate([3, 4], params=greedy, max_tokens=48, k="auto").token_ids == want
    spec = pair.generate([3, 4], params=greedy, max_tokens=48, k=drafting_planner(pair))
    assert spec.token_ids == want
    assert spec.stats.k == "auto" and spec.stats.n_drafted > 0
    assert len(set(spec.stats.k_steps[:4])) > 1  # chosen per step (too early for the budget to cap)
    for params in (SamplingParams(1.0), SamplingParams(1.0, sampler="coupled")):
        exact = synthetic_pair()
        assert level2(exact, params, drafting_planner(exact), n=500)["p"] > 1e-3
