"""Predicted Outputs (specmac.core.prediction): alignment, accounting, and losslessness.

Greedy: the tokens with a prediction equal target-only decoding's on the synthetic pair and on the
embedded pair of every installed backend (with no draft and with a draft model behind the
prediction); a planted rule that accepts every draft makes that comparison fail. T > 0: level 2
(exact distributions, tests/support/exact.py) passes with a prediction, and rejects a loop that
verifies the prediction's drafts with a wrong q.
"""

from __future__ import annotations

import numpy as np
import pytest

from specmac.api import Pair
from specmac.core import loop
from specmac.core.planner import Planner
from specmac.core.prediction import PredictionDrafter, prediction_text
from specmac.core.sampling import SamplingParams, sample
from tests.support.exact import FrozenCosts, level2, synthetic_pair
from tests.support.helpers import skip_unless_installed

GREEDY, T1 = SamplingParams(0.0), SamplingParams(1.0)


def always_accept(drafts, q, p, rng):  # planted: keeps every draft
    return len(drafts), int(np.argmax(p[len(drafts)])) if q is None else sample(p[len(drafts)], rng)


# --- alignment and accounting (no model) ---------------------------------------------------

def test_proposes_from_the_start_then_follows_and_realigns():
    d = PredictionDrafter([10, 11, 12, 13, 14, 15, 16, 17])
    prompt = [1, 2, 3]
    assert d.propose(prompt, 3) == ([10, 11, 12], "prediction")
    d.settle("prediction", 3, 2)  # kept 10, 11; the target wrote 99 instead of 12 (an edit)
    seq = prompt + [10, 11, 99]
    assert d.propose(seq, 3)[0] == []  # 99 is nowhere in the prediction
    d.settle("none", 0, 0)
    seq += [13]  # back on the prediction after the edit: realigned after 13
    assert d.propose(seq, 3)[0] == [14, 15, 16]
    d.settle("prediction", 3, 3)
    seq += [14, 15, 16, 17]  # all kept plus the bonus token: the alignment advances past them
    assert d.propose(seq, 3)[0] == []  # the prediction is used up
    assert d.usage() == {"accepted_prediction_tokens": 5, "rejected_prediction_tokens": 1}


def test_steps_another_source_drafted_are_not_counted():
    """The prediction settles only its own steps: a model's drafts at the same step count nothing."""
    d = PredictionDrafter([10, 11, 12])
    assert d.propose([1], 3)[0] == [10, 11, 12]
    d.settle("synthetic", 3, 2)
    assert d.usage() == {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}


def test_realigns_to_the_nearest_occurrence_after_the_edit():
    pred = [5, 7, 1, 7, 2, 7, 3]  # 7 occurs three times
    d = PredictionDrafter(pred)
    d.propose([0], 4)
    d.settle("prediction", 4, 3)  # kept 5, 7, 1; corrected 9 for 7
    assert d.propose([0, 5, 7, 1, 9], 1)[0] == []
    d.settle("none", 0, 0)
    # after "9 2" the suffix "2" matches at index 4: propose from 5 on
    assert d.propose([0, 5, 7, 1, 9, 2], 2)[0] == [7, 3]


def test_a_prediction_is_a_free_source():
    """Its proposals cost no model pass and are verified with a one-hot q (the loop's, as for
    every free source)."""
    d = PredictionDrafter([3, 4])
    assert d.backend is None
    assert d.propose([1], 2) == ([3, 4], "prediction")


def test_the_pairs_model_drafts_off_the_prediction():
    """Where the output has left the prediction, the pair's own draft model drafts (the planner
    weighs both), and the text is still the target's own."""
    pair = synthetic_pair(V=40, noise=0.3, eos_bias=-8.0)
    base = pair.plain().generate([1, 2], params=GREEDY, max_tokens=30)
    pred = base.token_ids[:8] + [39] * 4  # followed for eight tokens, then nothing it has
    # frozen costs (a cheap draft): whether the model pays is the planner's to weigh on timings, and
    # a loaded machine may rightly say no; which source drafts where is what this test is about
    planner = Planner(pair.sources, FrozenCosts(pair.drafts), k=4)
    out = pair.generate([1, 2], params=GREEDY, max_tokens=30, k=planner, prediction=pred)
    assert out.token_ids == base.token_ids
    assert out.stats.sources.get("prediction", 0) > 0 and out.stats.sources.get("synthetic", 0) > 0
    assert out.prediction["accepted_prediction_tokens"] > 0


def test_prediction_text_takes_strings_and_text_parts():
    assert prediction_text("ab") == "ab"
    assert prediction_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    with pytest.raises(TypeError):
        prediction_text([{"type": "image"}])


# --- greedy: identical to target-only decoding ----------------------------------------------

def edited(ids: list[int], vocab_size: int) -> list[int]:
    """The output with one token changed in the middle and one dropped later: an edit to realign after."""
    out = list(ids)
    out[len(out) // 3] = (out[len(out) // 3] + 1) % (vocab_size - 1)
    del out[2 * len(out) // 3]
    return out


def check_exact(pair: Pair, prompt, max_tokens=48, rule=None, prediction=None):
    base = pair.plain().generate(prompt, params=GREEDY, max_tokens=max_tokens)
    pred = prediction if prediction is not None else edited(base.token_ids, pair.target.vocab.size)
    out = pair.generate(prompt, params=GREEDY, max_tokens=max_tokens, k=4, prediction=pred, rule=rule)
    return base, out


def test_greedy_synthetic_equals_target_only():
    pair = synthetic_pair(V=12, eos_bias=-8.0)
    for prompt in ([1, 2], [4], [0, 3]):
        base, out = check_exact(pair.plain(), prompt, max_tokens=30)
        assert out.token_ids == base.token_ids
        assert out.prediction["accepted_prediction_tokens"] > 0  # the prediction was used
        base, out = check_exact(pair, prompt, max_tokens=30)  # a draft model behind it
        assert out.token_ids == base.token_ids


def test_planted_always_accept_fails_the_exactness_check():
    pair = synthetic_pair(V=12, eos_bias=-8.0)
    base, out = check_exact(pair.plain(), [1, 2], max_tokens=30, rule=always_accept)
    assert out.token_ids != base.token_ids  # the check above would have caught it


@pytest.mark.parametrize("backend", [pytest.param(b, marks=skip_unless_installed(b))
                                     for b in ("gguf", "torch", "mlx")])
def test_greedy_embedded_pair_equals_target_only(backend):
    prompt = "def add(a, b):"
    for draft in ("none", backend):
        pair = Pair.load(backend, draft)
        base, out = check_exact(pair, prompt)
        assert out.token_ids == base.token_ids, draft
        if draft == "none":
            assert out.prediction["accepted_prediction_tokens"] > 0
            assert out.stats.n_target_passes < base.stats.n_target_passes
        # the planted rule fails the same comparison on the same prediction
        _, bad = check_exact(pair, prompt, rule=always_accept)
        assert bad.token_ids != base.token_ids


# --- T > 0: the exact distribution ----------------------------------------------------------

class PredictedPair(Pair):
    """Every generation gets a fresh prediction drafter over ``pred``."""

    def __init__(self, target, sources, pred):
        super().__init__(target, sources)
        self.pred = pred

    def generate(self, prompt, **kw):
        return super().generate(prompt, prediction=PredictionDrafter(self.pred), **kw)


class UniformRows(loop.OneHotRows):  # planted: a free source's certain drafts reported with a uniform q
    def __getitem__(self, i):
        return np.full(self.n_vocab, 1.0 / self.n_vocab)


@pytest.mark.parametrize("with_draft", [False, True])
def test_level2_with_a_prediction(with_draft, monkeypatch):
    base = synthetic_pair()
    pred = base.plain().generate([1, 2], params=GREEDY, max_tokens=10).token_ids
    good = PredictedPair(base.target, base.sources if with_draft else [], pred)
    assert level2(good, T1, 4, n=1000, seed=5)["p"] > 1e-3
    monkeypatch.setattr(loop, "OneHotRows", UniformRows)
    assert level2(good, T1, 4, n=1000, seed=5)["p"] < 1e-4


@pytest.mark.parametrize("draft", [None, "synthetic"])
def test_coupled_sampler_with_a_prediction_is_seed_exact(draft):
    """Under the coupled sampler a prediction (with or without a draft model behind it) changes no
    token: the text at T = 1 is plain decoding's at the same seed."""
    pair = Pair.load("synthetic", draft)
    params = SamplingParams(1.0, sampler="coupled")
    plain = pair.plain().generate("hello", params=params, max_tokens=40, seed=7).token_ids
    edited = pair.target.decode(plain[:12]) + "xyz" + pair.target.decode(plain[12:])
    for k in (2, 6):
        got = pair.generate("hello", params=params, max_tokens=40, seed=7, k=k, prediction=edited)
        assert got.token_ids == plain and got.prediction["accepted_prediction_tokens"] > 0
