"""Level 1 of the proof: one verify step emits exactly p (float64, to 1e-12)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specmac.core.rejection import accept_greedy, accept_sampled, acceptance_probability, residual
from specmac.core.sampling import SamplingParams, warp

GREEDY = SamplingParams(0.0)


def step_distribution(p, q):
    """Exact distribution of the first token one verify step emits (K = 1), built from the same
    acceptance_probability and residual that accept_sampled uses."""
    accept = np.array([acceptance_probability(p[x], q[x]) for x in range(len(p))])
    p_reject = float(np.sum(q * (1 - accept)))
    return q * accept + p_reject * residual(p, q)


def normalized(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def random_pair(rng, V, zeros_p=0, zeros_q=0):
    p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
    p[rng.choice(V, zeros_p, replace=False)] = 0
    q[rng.choice(V, zeros_q, replace=False)] = 0
    return normalized(p), normalized(q)


@pytest.mark.parametrize("V", [2, 3, 5, 16, 64])
def test_output_is_p_random(V):
    rng = np.random.default_rng(V)
    for _ in range(200):
        p, q = random_pair(rng, V, zeros_p=rng.integers(0, V - 1), zeros_q=rng.integers(0, V - 1))
        np.testing.assert_allclose(step_distribution(p, q), p, atol=1e-12, rtol=0)


def test_special_cases():
    cases = {
        "p == q": (normalized([1, 2, 3, 4]), normalized([1, 2, 3, 4])),
        "q zero where p positive": (normalized([1, 1, 1, 1]), normalized([0, 0, 1, 1])),
        "p zero where q positive": (normalized([0, 0, 1, 1]), normalized([1, 1, 1, 1])),
        "one-hot q": (normalized([1, 2, 3, 4]), np.array([0.0, 0.0, 1.0, 0.0])),
        "one-hot q outside p": (normalized([1, 1, 0, 0]), np.array([0.0, 0.0, 0.0, 1.0])),
        "one-hot p": (np.array([0.0, 1.0, 0.0]), normalized([1, 1, 1])),
        "ties": (normalized([2, 2, 1, 1]), normalized([1, 1, 2, 2])),
        "disjoint supports": (normalized([1, 1, 0, 0]), normalized([0, 0, 1, 1])),
        "p = q up to round-off": (normalized([1, 2, 3]), normalized([1, 2, 3]) * (1 + 1e-16)),
    }
    for name, (p, q) in cases.items():
        np.testing.assert_allclose(step_distribution(p, q), p, atol=1e-12, rtol=0, err_msg=name)


probs = st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=12).filter(lambda x: sum(x) > 1e-3)


@settings(max_examples=300, deadline=None)
@given(probs, st.data())
def test_output_is_p_property(p_raw, data):
    V = len(p_raw)
    q_raw = data.draw(st.lists(st.floats(0, 1, allow_nan=False), min_size=V, max_size=V)
                      .filter(lambda x: sum(x) > 1e-3))
    p, q = normalized(p_raw), normalized(q_raw)
    out = step_distribution(p, q)
    np.testing.assert_allclose(out, p, atol=1e-12, rtol=0)
    assert np.all(out[p == 0] == 0)


class ScriptedRng:
    """Returns the given uniforms in order (for checking verify's decisions exactly)."""

    def __init__(self, *u):
        self.u = list(u)

    def random(self):
        return self.u.pop(0)


def test_decisions_at_the_threshold():
    p = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    q = np.array([[0.4, 0.3, 0.3]])
    # draft 0: acceptance p/q = 0.5
    assert accept_sampled([0], q, p, ScriptedRng(0.4999, 0.99))[0] == 1  # accepted; bonus from p[1]
    assert accept_sampled([0], q, p, ScriptedRng(0.4999, 0.99))[1] == 2
    a, nxt = accept_sampled([0], q, p, ScriptedRng(0.5001, 0.0))
    assert a == 0 and nxt == 2  # residual max(0, p - q) = [0, 0, 0.2]: only id 2
    # draft 2: p >= q, always accepted
    assert accept_sampled([2], q, p, ScriptedRng(0.99999, 0.5))[0] == 1


def test_residual_guard_falls_back_to_p():
    p = normalized([1, 2, 3])
    assert np.array_equal(residual(p, p.copy()), p)


def test_monte_carlo_through_verify_sampled():
    rng = np.random.default_rng(7)
    p, q = normalized([0.05, 0.4, 0.0, 0.3, 0.25]), normalized([0.3, 0.1, 0.2, 0.0, 0.4])
    out = []
    for _ in range(20000):
        d = int(rng.choice(5, p=q))
        a, nxt = accept_sampled([d], q[None], np.stack([p, p]), rng)
        out.append(d if a else nxt)  # the first emitted token
    counts = np.bincount(out, minlength=5)
    assert counts[2] == 0
    keep = p > 0
    assert stats.chisquare(counts[keep], p[keep] * counts.sum()).pvalue > 1e-3


def test_greedy_rule():
    p = np.eye(4)[[2, 1, 3]]  # target argmax 2, then 1, then 3
    assert accept_greedy([2, 1], None, p) == (2, 3)
    assert accept_greedy([2, 0], None, p) == (1, 1)
    assert accept_greedy([0, 1], None, p) == (0, 2)
    assert accept_greedy([], None, p[:1]) == (0, 2)


def test_greedy_rule_on_logits_equals_on_probabilities():
    """The loop hands the greedy rule raw logits: warping keeps the argmax, lowest id on ties."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        logits = rng.integers(-3, 3, size=(4, 6)).astype(np.float32)  # many ties
        drafts = list(rng.integers(0, 6, size=3))
        assert accept_greedy(drafts, None, logits) == accept_greedy(drafts, None, warp(logits, GREEDY))


# --- the greedy diagnosis of `specmac verify` (level 3's greedy half) -------------------------

def test_first_difference():
    from specmac.lossless.greedy import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one stopped early (EOS)


def _pair(target_cls, **kw):
    from specmac.api import Pair
    from specmac.backends.synthetic import SyntheticBackend
    from specmac.core.drafters import ModelDrafter

    opts = {"vocab_size": 40, "seed": 2, "eos_bias": -8.0}
    return Pair(target_cls(role="target", **opts, **kw), ModelDrafter(SyntheticBackend(role="draft", **opts)))


def test_greedy_match_on_a_correct_pair():
    from specmac.backends.synthetic import SyntheticBackend
    from specmac.lossless.greedy import greedy_check

    res = greedy_check(_pair(SyntheticBackend), [[1], [5, 6, 7], [30, 2]], k=4, max_tokens=40)
    assert res["greedy_agreement"] == 1.0 and res["greedy_unexplained"] == 0


def test_a_batched_pass_that_rounds_differently_is_a_near_tie_flip():
    """Batched rows off by a fault: where greedy outputs part, the batched-vs-serial difference
    there is at least the target's top-2 gap (it must be, to flip the argmax)."""
    from specmac.lossless.greedy import greedy_check
    from tests.lossless.test_planted_bugs import FaultyBatched

    res = greedy_check(_pair(FaultyBatched, fault=1.0), [[1], [5, 6, 7], [30, 2], [11], [20, 21]],
                       k=4, max_tokens=40)
    assert res["greedy_mismatches"], "the fault should flip at least one argmax"
    for m in res["greedy_mismatches"]:
        assert m["near_tie"] and m["top2_gap"] <= m["batched_vs_serial"], m
    assert res["greedy_unexplained"] == 0


def test_a_loop_bug_is_not_a_near_tie():
    """With a rewind off by one, outputs part although batched and serial rows agree: FAIL."""
    from specmac.cli.render import verdict
    from specmac.lossless.greedy import greedy_check
    from tests.lossless.test_planted_bugs import RewindOneShort

    res = greedy_check(_pair(RewindOneShort), [[1], [5, 6, 7], [30, 2]], k=4, max_tokens=40)
    # every parting a bug: the diagnosis's replay of the run's passes does not trust a rewind
    # that misses its mark (with it, two of the three would read as near ties)
    assert res["greedy_unexplained"] == len(res["greedy_mismatches"]) >= 1, res
    m = next(m for m in res["greedy_mismatches"] if not m["near_tie"])
    assert m["batched_vs_serial"] == 0.0 and m["top2_gap"] > 0 and m["rounding_unit"] == 0.0
    full = {"p_value": 0.5, "min_detectable_tv": 0.1, "positions": 10, "dof": 40, "n_categories": 41,
            "contexts": ["a", "b", "c"], "greedy_agreement": res["greedy_agreement"]} | res
    text = verdict(full)
    assert text.startswith("FAIL") and "NOT a near tie" in text


def test_a_gap_of_one_unit_of_a_16_bit_targets_rounding_is_a_tie():
    """Logits rounded to bf16 (their low 16 bits empty) or fp16: the spacing at the top logit, within
    which a parting is a tie (the run's cache rows, computed in passes of other widths, round
    otherwise than the one pass recomputed); fp32 logits: none, the recomputed pass alone judges."""
    from specmac.lossless.greedy import rounding_unit, summary

    row = (np.random.default_rng(0).normal(size=1000) * 4 + 12).astype(np.float32)
    assert rounding_unit(row) == 0.0
    bf16 = (row.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    assert 16 <= bf16.max() < 32 and rounding_unit(bf16) == 0.125  # 2^4 at 8 significant bits
    fp16 = row.astype(np.float16).astype(np.float32)
    assert rounding_unit(fp16) == float(np.spacing(np.float16(fp16.max()))) == 2.0 ** -6
    tie = {"first_difference": 40, "top2_gap": 0.125, "batched_vs_serial": 0.0, "rounding_unit": 0.125,
           "near_tie": True}
    assert "within the logits' 16-bit rounding unit 0.125" in summary(tie)


def test_the_diagnosis_replays_the_runs_passes_so_a_flip_at_a_plain_step_is_a_near_tie(monkeypatch):
    """A kernel whose cache rows round otherwise when a pass of 2 to 5 tokens wrote them (as
    quantized kernels on a CPU switch at a batch size): the run parts from plain decoding at a
    plain step after batched ones, where recomputing the one pass after the history read in one
    piece finds no difference. Replaying the run's passes finds it: a near-tie flip. The same
    partings judged without the replay are called bugs (fails if ``diagnose`` stops replaying),
    and a loop bug is still one with it (``test_a_loop_bug_is_not_a_near_tie``)."""
    from specmac.backends.synthetic import SyntheticBackend
    from specmac.lossless import greedy

    class RowsByWidth(SyntheticBackend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            V = self.vocab.size
            self.fault = 1.5 * np.random.default_rng([self.resolved["seed"], 9]).standard_normal((V + 1, V))
            self.wide: list[bool] = []  # per cached row: a pass of 2 to 5 tokens wrote it

        def score(self, tokens):
            n0, rows = self.n_past, super().score(tokens)
            self.wide = self.wide[:n0] + [2 <= len(tokens) <= 5] * len(tokens)
            read = np.array([self.wide[n0 + i - 1] if n0 + i else False for i in range(len(tokens))])
            return rows + np.where(read[:, None], self.fault[np.asarray(tokens)], 0.0).astype(np.float32)

    contexts = [[1], [5, 6, 7], [30, 2], [11], [20, 21], [8, 9], [3]]
    replayed = greedy.greedy_check(_pair(RowsByWidth), contexts, k=4, max_tokens=40)
    found = replayed["greedy_mismatches"]
    assert found, "the rows' rounding should flip at least one argmax"
    assert all(m["near_tie"] and m["top2_gap"] <= m["batched_vs_serial"] for m in found), found
    one_pass = greedy.rows_at
    monkeypatch.setattr(greedy, "rows_at", lambda *a, steps=None, **kw: one_pass(*a, **kw))
    unreplayed = greedy.greedy_check(_pair(RowsByWidth), contexts, k=4, max_tokens=40)
    assert unreplayed["greedy_unexplained"] >= 1, unreplayed


def test_the_diagnosis_excuses_one_rounding_unit_of_16_bit_logits_only(monkeypatch):
    """A real parting (a loop bug) diagnosed on rows whose top two logits are one bf16 unit apart and
    whose recomputed pass agrees: a tie where the rows are bf16 values, a bug where the same gap
    sits in fp32 rows (fails if ``diagnose`` judges by the batched-vs-serial difference alone, or
    excuses the gap on every row)."""
    from specmac.lossless import greedy
    from tests.lossless.test_planted_bugs import RewindOneShort

    def rows(top):  # 40 logits, the top two ``unit`` apart at the top value, batched == serial
        row = (np.linspace(-8.0, 8.0, 40).astype(np.float32).view(np.uint32)
               & np.uint32(0xFFFF0000)).view(np.float32)  # bf16 values
        row[-2:] = [top - 0.125, top]
        return lambda *a, **k: (row.astype(np.float64), row.astype(np.float64))

    def diagnosed(top):  # a fresh pair each time: a run leaves its caches held for the next
        monkeypatch.setattr(greedy, "rows_at", rows(top))
        return greedy.diagnose(_pair(RewindOneShort), [5, 6, 7], k=4, max_tokens=40)  # it parts there

    tie = diagnosed(20.0)  # every value a bf16 value
    assert not tie["match"] and tie["rounding_unit"] == 0.125 and tie["near_tie"], tie
    bug = diagnosed(20.0 + 2 ** -18)  # two fp32 values, the same gap
    assert not bug["match"] and bug["rounding_unit"] == 0.0 and not bug["near_tie"], bug


def test_compare_greedy_cell_names_near_ties_and_bugs():
    from specmac.compare.report import greedy_cell

    tie = {"near_tie": True, "first_difference": 11, "prompt": "p1"}
    bug = {"near_tie": False, "first_difference": 2, "prompt": "p2"}
    assert greedy_cell({"greedy_match": 1.0}) == "100%"
    cell = greedy_cell({"greedy_match": 0.5, "greedy_mismatches": [tie, bug]})
    assert cell == "50% (1 near-tie flip; 1 NOT near-tie (bug); part at p1@12, p2@3)"
