"""Power of the losslessness checks: planted bugs that each check must reject.

Every mutant below is a deliberately wrong variant of the rejection rule, the drafter, the loop's
rewind or a backend's batched pass, injected from here (the ``rule=`` hook, small subclasses); none
lives in the package. Each must be rejected (i) by level 2 (exact distributions of the synthetic
pair, tests/support/exact.py) and (ii) by the verify harness at its default settings on the synthetic
pair (`specmac verify --draft synthetic --target synthetic --temperature 1`), while the correct loop
passes both. ``python3 -m tests.lossless.test_planted_bugs`` prints the table of mutants x p-values.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.drafters import ModelDrafter
from specmac.core.rejection import accept_sampled, acceptance_probability, residual
from specmac.core.sampling import SamplingParams, sample, warp
from specmac.lossless.harness import (
    DEFAULT_CONTEXTS,
    DEFAULT_TOKENS,
    compare_samples,
    default_length,
    sample_continuations,
)
from tests.support.exact import level2, synthetic_pair

T1 = SamplingParams(1.0)
REJECT = 1e-4  # a mutant must be rejected at least this clearly
PASS = 1e-3  # the correct loop must not be


# --- mutants of the rule (the rule= hook) --------------------------------------------------

def always_accept(drafts, q, p, rng):
    return len(drafts), sample(p[len(drafts)], rng)


def p_not_residual(drafts, q, p, rng):
    for i, d in enumerate(drafts):
        if rng.random() >= acceptance_probability(p[i][d], q[i][d]):
            return i, sample(p[i], rng)  # bug: p instead of normalize(max(0, p - q))
    return len(drafts), sample(p[len(drafts)], rng)


def one_uniform(drafts, q, p, rng):
    for i, d in enumerate(drafts):
        u = rng.random()
        if u >= acceptance_probability(p[i][d], q[i][d]):
            c = np.cumsum(residual(p[i], q[i]))  # bug: the accept test's u draws the residual too
            return i, int(min(np.searchsorted(c, u * c[-1], side="right"), len(c) - 1))
    return len(drafts), sample(p[len(drafts)], rng)


def bonus_wrong_row(drafts, q, p, rng):
    a, nxt = accept_sampled(drafts, q, p, rng)
    if a == len(drafts) and drafts:
        return a, sample(p[a - 1], rng)  # bug: the bonus token from the last draft's row
    return a, nxt


def unnormalised_residual(drafts, q, p, rng):
    for i, d in enumerate(drafts):
        if rng.random() >= acceptance_probability(p[i][d], q[i][d]):
            r = np.maximum(p[i] - q[i], 0.0)  # bug: not normalised, drawn as if it summed to 1
            return i, int(min(np.searchsorted(np.cumsum(r), rng.random(), side="right"), len(r) - 1))
    return len(drafts), sample(p[len(drafts)], rng)


# --- mutants of the drafter, the loop's rewind and the backend ----------------------------

class SharedStreamDrafter(ModelDrafter):
    """Bug: the verifier replays the uniforms the draft was sampled with (one stream for both)."""

    def draft(self, seq, k, params, rng, n_vocab, noise=None):
        state = rng.bit_generator.state
        out = super().draft(seq, k, params, rng, n_vocab, noise)
        rng.bit_generator.state = state
        return out


class OtherSettingsDrafter(ModelDrafter):
    """Bug: drafts sampled at 0.7x the temperature, q reported as warped with the target's settings."""

    def draft(self, seq, k, params, rng, n_vocab, noise=None):
        other = dataclasses.replace(params, temperature=params.temperature * 0.7)
        drafts, q = super().draft(seq, k, other, rng, n_vocab, noise)
        if params.greedy:
            return drafts, q
        return drafts, [warp(self.backend.next_logits(list(seq) + drafts[:i]), params)
                        for i in range(len(drafts))]


class RewindOneShort(SyntheticBackend):
    """Bug: the loop rewinds to len(seq) - 2 instead of len(seq) - 1 (the loop's rewinds are the
    only calls with n_past > 0), in target-only decoding too, as one shared loop would."""

    def rewind(self, n_past):
        super().rewind(max(0, n_past - 1))


class RewindKeepsRejected(SyntheticBackend):
    """Bug: the loop rewinds to len(seq), short of the pass's end: after a rejection the cache keeps
    the rejected draft. Only the next pass's first row sees it, through the synthetic model's weak
    dependence on the token before last: level 2 catches it, verify on the default pair cannot
    (there it moves ~0.1% of sequences), so it is in the table but not in MUTANTS."""

    def rewind(self, n_past):
        super().rewind(min(n_past + 1, self.n_past))


class FaultyBatched(SyntheticBackend):
    """A mis-ported kernel: a pass of n > 1 tokens returns rows off by a fixed table (RMS
    ``fault`` logits) from what one-token passes return; serial decoding is untouched."""

    def __init__(self, *a, fault=0.2, **kw):
        super().__init__(*a, **kw)
        V = self.vocab.size
        self.fault = fault * np.random.default_rng([self.resolved["seed"], 7]).standard_normal((V + 1, V))

    def score(self, tokens):
        rows = super().score(tokens)
        if len(tokens) > 1:
            rows = rows + self.fault[np.asarray(tokens)].astype(np.float32)
        return rows


def _swap(pair: Pair, drafter_cls=None, target_cls=None) -> Pair:
    t, d = pair.target, pair.sources[0].backend
    target = target_cls(role="target", **t.resolved) if target_cls else t
    return Pair(target, (drafter_cls or ModelDrafter)(d))


# name -> (rule, drafter class, target class)
MUTANTS = {
    "always accept drafts": (always_accept, None, None),
    "p instead of the residual": (p_not_residual, None, None),
    "one uniform for accept and residual": (one_uniform, None, None),
    "draft and verifier share a stream": (None, SharedStreamDrafter, None),
    "bonus from the wrong row": (bonus_wrong_row, None, None),
    "unnormalised residual": (unnormalised_residual, None, None),
    "q warped with other settings": (None, OtherSettingsDrafter, None),
    "rewind off by one (one short)": (None, None, RewindOneShort),
}
LEVEL2_ONLY = {"rewind off by one (keeps the rejected draft)": (None, None, RewindKeepsRejected)}
FAULTY = "faulty batched pass (RMS 0.2 logits)"


def mutant_pair(base: Pair, name: str) -> tuple[Pair, object]:
    if name == "correct":
        return base, None
    if name == FAULTY:
        return _swap(base, target_cls=FaultyBatched), None
    rule, dcls, tcls = (MUTANTS | LEVEL2_ONLY)[name]
    return _swap(base, dcls, tcls), rule


# --- (i) level 2 ----------------------------------------------------------------------------

@pytest.mark.parametrize("k", [3, 8])
@pytest.mark.parametrize("name", ["correct", *MUTANTS, *LEVEL2_ONLY])
def test_level2_rejects_every_mutant(name, k):
    pair, rule = mutant_pair(synthetic_pair(), name)
    p = level2(pair, T1, k, n=1000, seed=k, rule=rule)["p"]
    if name == "correct":
        assert p > PASS, p
    else:
        assert p < REJECT, f"level 2 missed '{name}' at K={k}: p = {p:.3g}"


# --- (ii) the verify harness at its default settings ----------------------------------------

K = 4  # verify's default


def _verify_setup():
    """The default synthetic pair of `specmac verify` and its target-only samples (shared by all
    mutants: only the speculative side differs)."""
    base = Pair.load("synthetic", "synthetic")
    ctx = [base.encode(c) for c in DEFAULT_CONTEXTS]
    kw = dict(params=T1, length=default_length(K), k=K, seed=0,
              n=-(-DEFAULT_TOKENS // (default_length(K) * len(ctx))))
    return base, ctx, kw, sample_continuations(base.plain(), ctx, method=1, **kw)


@pytest.fixture(scope="module")
def verify_setup():
    return _verify_setup()


def verify_p(setup, name: str) -> dict:
    base, ctx, kw, auto = setup
    pair, rule = mutant_pair(base, name)
    return compare_samples(sample_continuations(pair, ctx, method=0, rule=rule, **kw), auto)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["correct", *MUTANTS, FAULTY])
def test_verify_rejects_every_mutant(verify_setup, name):
    res = verify_p(verify_setup, name)
    if name == "correct":
        assert res["p_value"] > PASS, res["p_value"]
        kinds = res["n_by_kind"]
        assert min(kinds["accepted"], kinds["corrected"], kinds["bonus"]) > 1000, kinds
    else:
        assert res["p_value"] < REJECT, f"verify missed '{name}': p = {res['p_value']:.3g}"


def table() -> list[str]:
    """Mutant x p-value at level 2 (K = 3 and 8) and with verify's defaults."""
    import time

    base = synthetic_pair()
    rows = ["| mutant | level 2, K=3 | level 2, K=8 | verify (defaults) | decisive test |",
            "|---|---:|---:|---:|---|"]
    t = time.perf_counter()
    setup = _verify_setup()
    for name in ["correct", *MUTANTS, *LEVEL2_ONLY, FAULTY]:
        lv = ["–", "–"]
        if name != FAULTY:
            pair, rule = mutant_pair(base, name)
            lv = [f"{level2(pair, T1, k, n=1000, seed=k, rule=rule)['p']:.2g}" for k in (3, 8)]
        v = verify_p(setup, name)
        rows.append(f"| {name} | {lv[0]} | {lv[1]} | {v['p_value']:.2g} | {v['decisive_test']} |")
        print(rows[-1], f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return rows


if __name__ == "__main__":
    print("\n".join(table()))
