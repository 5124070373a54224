"""Power of the checks of the coupled sampler: planted bugs that each must reject.

Two mutants of the coupled sampler itself, and the pipeline mutants of test_planted_bugs.py run
under it (rewind off by one both ways, a faulty batched pass, the bonus token from the wrong row).
Each pipeline mutant must be rejected (i) by level 2 (exact distributions, tests/support/exact.py)
and (ii) by the seed-exact harness (`specmac verify --exact`) at its defaults on the synthetic
pair, which needs a few sequences where the chi-square harness generates 100,000 tokens per method.

"Different noise for draft and target" is not a losslessness bug: the coupled rule emits the
target's perturbed argmax whatever was drafted, so its text is still exact (both checks pass it,
as they must); what it breaks is acceptance, and the analytic-rate test rejects it.
``python3 -m tests.lossless.test_coupled_bugs`` prints the table of mutants.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.drafters import ModelDrafter
from specmac.core.rejection import accept_greedy
from specmac.core.sampling import GumbelNoise, SamplingParams
from specmac.lossless.exact import exact_check
from specmac.lossless.harness import DEFAULT_TOKENS
from tests.lossless.test_planted_bugs import FaultyBatched, RewindOneShort, _swap
from tests.support.exact import first_acceptance, level2, synthetic_pair

COUPLED = SamplingParams(1.0, sampler="coupled")
REJECT, PASS = 1e-4, 1e-3


class StepKeyedNoise(GumbelNoise):
    """Bug: a step's noise is keyed by the step's index instead of its output position (the two
    agree in plain decoding, one token per step)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.n_steps = 0

    def step(self, start):
        self.n_steps += 1
        return super().step(self.n_steps - 1)


class OtherNoiseDrafter(ModelDrafter):
    """Bug (of speed only): the draft perturbs with noise of another key than the target's."""

    def draft(self, seq, k, params, rng, n_vocab, noise=None):
        if noise is not None:
            noise = GumbelNoise(noise.noise.seed + 1, n_vocab).step(noise.start)
        return super().draft(seq, k, params, rng, n_vocab, noise=noise)


class RewindKeepsRejected(SyntheticBackend):
    """Bug: the loop's rewinds (the only calls with n_past > 0) keep one token too many, so after
    a rejection the cache holds the rejected draft. (The mutant of that name in test_planted_bugs
    also breaks reset(), which leaves a stale first token and then makes every later sequence
    right again; this one changes nothing else.)"""

    def rewind(self, n_past):
        super().rewind(min(n_past + 1, self.n_past) if n_past else 0)


def bonus_wrong_row(drafts, q, p, rng):
    """Bug: after all drafts are kept, the bonus token from the last draft's (perturbed) row."""
    a, nxt = accept_greedy(drafts, q, p, rng)
    if a == len(drafts) and drafts:
        return a, int(np.argmax(p[a - 1]))
    return a, nxt


# name -> (rule, drafter class, target class, noise)
PIPELINE = {
    "rewind off by one (one short)": (None, None, RewindOneShort, None),
    "rewind off by one (keeps the rejected draft)": (None, None, RewindKeepsRejected, None),
    "faulty batched pass (RMS 0.2 logits)": (None, None, FaultyBatched, None),
    "bonus from the wrong row": (bonus_wrong_row, None, None, None),
    "noise keyed by step, not position": (None, None, None, StepKeyedNoise),
}
SPEED_ONLY = {"different noise for draft and target": (None, OtherNoiseDrafter, None, None)}


def mutant(base: Pair, name: str) -> tuple[Pair, dict]:
    if name == "correct":
        return base, {}
    rule, dcls, tcls, noise = (PIPELINE | SPEED_ONLY)[name]
    return _swap(base, dcls, tcls), {"rule": rule, "noise": noise}


# --- (i) level 2 ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["correct", *PIPELINE, *SPEED_ONLY])
def test_level2_rejects_every_coupled_mutant(name):
    pair, kw = mutant(synthetic_pair(), name)
    p = level2(pair, COUPLED, 3, n=1000, seed=3, **kw)["p"]
    if name in PIPELINE:
        assert p < REJECT, f"level 2 missed '{name}': p = {p:.3g}"
    else:  # lossless: the correct sampler and the speed-only mutant pass
        assert p > PASS, p


def test_acceptance_rejects_different_noise_for_draft_and_target():
    base = synthetic_pair(V=8, noise=0.8, eos_bias=-8)
    measured, expected, bound = first_acceptance(base, "coupled")
    assert abs(measured - expected) < bound
    pair, _ = mutant(base, "different noise for draft and target")
    measured, expected, bound = first_acceptance(pair, "coupled")
    assert measured < expected - bound, (measured, expected)


# --- (ii) the seed-exact harness at its defaults ----------------------------------------------

def exact_result(name: str, shared: bool = False) -> dict:
    """`verify --exact` at its defaults on the default synthetic pair. The twins come from the
    correct target, or (shared) from the mutant's own target, as the CLI runs it."""
    base = Pair.load("synthetic", "synthetic")
    pair, kw = mutant(base, name)
    ref = None if shared else Pair.load("synthetic").plain()
    return exact_check(pair, params=COUPLED, reference=ref, **kw)


@pytest.mark.parametrize("shared", [False, True], ids=["correct-twin", "shared-target"])
@pytest.mark.parametrize("name", ["correct", *PIPELINE, *SPEED_ONLY])
def test_exact_harness_rejects_every_pipeline_mutant_in_a_few_sequences(name, shared):
    res = exact_result(name, shared)
    if name in PIPELINE:
        assert res["n_failures"] > 0, res["partings"]
        # caught within the first 4 sequences of 32 tokens per method (the chi-square harness's
        # default is 100,000 tokens per method)
        assert res["first_failure"]["tokens_speculative"] <= 4 * 32 < DEFAULT_TOKENS / 500
    else:
        assert res["n_failures"] == 0 and res["n_identical"] == res["n_sequences"], res["partings"]


def test_exact_diagnoses_a_faulty_batched_pass_as_such():
    res = exact_result("faulty batched pass (RMS 0.2 logits)", shared=True)
    assert {d["diagnosis"] for d in res["partings"]} >= {"batched pass off"}


def table() -> list[str]:
    rows = ["| mutant | level 2 p (K=3) | verify --exact: failing sequences | tokens to the first failure |",
            "|---|---:|---:|---:|"]
    for name in ["correct", *PIPELINE, *SPEED_ONLY]:
        pair, kw = mutant(synthetic_pair(), name)
        p = level2(pair, COUPLED, 3, n=1000, seed=3, **kw)["p"]
        r = exact_result(name, shared=True)
        first = r["first_failure"]["tokens_speculative"] if r["first_failure"] else "-"
        rows.append(f"| {name} | {p:.2g} | {r['n_failures']} of {r['n_sequences']} | {first} |")
        print(rows[-1], file=sys.stderr)
    return rows


if __name__ == "__main__":
    print("\n".join(table()))
