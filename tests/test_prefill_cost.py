"""k="auto" counts the draft's prefill of the prompt against what drafting can win in the run."""

import numpy as np
import pytest

from specmac.api import Pair
from specmac.core.calibration import adaptive_policy, prefill_per_token
from specmac.core.policy import AdaptiveK
from specmac.core.sampling import SamplingParams

GREEDY = SamplingParams(0.0)
LONG = "the quick brown fox jumps over the lazy dog. " * 24  # 1080 characters = tokens here


@pytest.fixture(scope="module")
def pair():
    # a parallel target (30 ms a pass at any width) and a perfect draft whose pass is 1 ms but whose
    # prefill grows with the tokens (0.3 ms each beyond the first): drafting wins over 10 ms a token
    # written (at the prior's acceptance), the prefill of 1080 tokens costs about 320 ms
    return Pair.load("synthetic", "synthetic", target_options={"latency_ms": 30, "beta": 0.0},
                     draft_options={"latency_ms": 1, "beta": 0.3, "noise": 0.0})


def test_prefill_rate_is_measured(pair):
    rate = prefill_per_token(pair.drafter.backend)
    assert 0.3e-3 < rate < 1e-3  # (1 + 0.3 * 31) ms over 32 tokens, plus sleep overshoot


def test_long_prompt_short_answer_drafts_nothing(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    n = len(pair.encode(LONG))
    short = adaptive_policy(pair.target, pair.drafter.backend, horizon=8, n_prompt=n)
    assert short.prefill_s() > 0.3 and short.next_k() == 0
    out = pair.generate(LONG, params=GREEDY, max_tokens=8, k=short)
    assert out.stats.n_drafted == 0 and set(short.history) == {0}
    # the same prompt with a run long enough to win the prefill back drafts from the first step
    assert adaptive_policy(pair.target, pair.drafter.backend, horizon=256, n_prompt=n).next_k() >= 1
    # and so does a short prompt with the short run
    assert adaptive_policy(pair.target, pair.drafter.backend, horizon=8, n_prompt=10).next_k() >= 1
    # without the prompt's length the policy is as before: it drafts
    assert adaptive_policy(pair.target, pair.drafter.backend, horizon=8).next_k() >= 1


def test_generate_passes_the_prompt_length(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    out = pair.generate(LONG, params=GREEDY, max_tokens=8, k="auto")
    assert out.stats.n_drafted == 0
    assert pair.generate(LONG, params=GREEDY, max_tokens=64, k="auto").stats.n_drafted > 0


def test_catching_up_after_plain_steps_counts_too():
    p = AdaptiveK(horizon=100)
    p.set_costs([1.0] * 17, 0.05)
    p.set_prefill(0.01, 10)
    assert p.prefill_s() == pytest.approx(0.1)

    class E:
        def __init__(self, d, a, n):
            self.n_drafted, self.n_accepted, self.tokens, self.k = d, a, [0] * n, d
            self.t_draft, self.t_target, self.t_other, self.t_prefill, self.n_passes = 0.0, 1.0, 0.0, 0.0, 1

    p.update(E(0, 0, 1))  # a plain step: the draft falls one more token behind
    assert p.n_behind == 11
    p.update(E(4, 2, 3))  # a drafting step: it has seen all but the corrected token
    assert p.n_behind == 1
    p.update(E(4, 4, 5))  # all kept: it has not scored the last draft nor the bonus token
    assert p.n_behind == 2 and p.n_out == 9


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-1.0", "0.0"])
def test_a_kept_prefill_rate_that_lies_is_measured_again(tmp_path, monkeypatch, bad):
    """The kept prefill rate is evidence like the pass costs: NaN, Inf or <= 0 is measured again."""
    from specmac.backends import load_backend
    from specmac.core import calibration

    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    draft = load_backend("synthetic", None, {"latency_ms": 0.5}, role="draft")
    first = calibration.cached_prefill_per_token(draft)
    (path,) = calibration.costs_dir().glob("prefill-*.json")
    path.write_text(path.read_text().replace(repr(first), bad, 1).replace(str(first), bad, 1))
    again = calibration.cached_prefill_per_token(draft)
    assert np.isfinite(again) and again > 0
