"""The lookup drafter: its index against a brute-force reference, its bets, and exactness."""

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.core.drafters import load_drafter
from specmac.core.lookup import LookupDrafter, NgramIndex
from specmac.core.sampling import SamplingParams
from tests.conftest import skip_unless_installed

GREEDY = SamplingParams(0.0)
RNG = np.random.default_rng(0)


def propose(d, seq, k):
    return d.propose(list(seq), k, GREEDY, RNG, 100)[0]


def test_prompt_lookup_cases_like_llama_cpp_python():
    # the cases of llama-cpp-python's prompt-lookup test, with a 2-token minimum match
    assert propose(LookupDrafter(min_match=2, max_match=3), [1, 2, 3, 1, 2, 3, 1, 2, 3], 2) == [1, 2]
    assert propose(LookupDrafter(min_match=2, max_match=3), [1, 2, 3, 4, 5, 6], 2) == []


def test_one_token_match_is_no_bet():
    d = LookupDrafter(min_match=2)
    assert propose(d, [5, 1, 7, 8, 9, 1], 4) == []  # only "1" recurs
    assert propose(d, [5, 1, 7, 8, 9, 5, 1], 4) == [7, 8, 9, 5]  # "5 1" recurs


class Curve:
    """A K policy stand-in for the bets: seconds of a step over n tokens, n = 0..33."""

    def __init__(self, beta):
        self.c = 1.0 + beta * (np.arange(34) - 1.0)
        self.c[0] = 1.0

    def width_costs(self):
        return self.c


def test_weak_matches_are_bet_on_only_where_costs_are_known():
    # k="auto" (the bets priced by the measured curve): a 1-token match is a bet like any other
    seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs
    flat = LookupDrafter(min_match=3)
    flat.bets.cost = Curve(0.0)  # every width costs one pass: any draft may pay
    assert propose(flat, seq, 4) == [7, 8, 9, 1] and flat.last_kind == "weak"
    # ... where its continuations agree on nothing, on the latest (as the n-gram drafter does)
    parted = [1, 7, 0, 2, 1, 8, 3, 1]  # "1" was followed by 7 and by 8
    assert propose(flat, parted, 3) == [8, 3, 1] and flat.last_kind == "latest"
    # a fixed K (no costs): no bet under min_match; a sure match agrees as before
    assert propose(LookupDrafter(min_match=3), seq, 4) == []
    assert propose(LookupDrafter(min_match=3), parted, 3) == []
    # a serial target (each width costs its tokens): the unproven weak bet is cut to nothing
    serial = LookupDrafter(min_match=3)
    serial.bets.cost = Curve(1.0)
    assert propose(serial, parted, 3) == [] and serial.last_kind == "latest"


def test_weak_and_latest_bets_are_kept_apart():
    d = LookupDrafter(min_match=3)
    d.bets.cost = Curve(0.0)
    text = [1, 7, 0, 2, 1, 8, 3, 1]
    for t in range(20):  # each latest-continuation bet is rejected: the target writes 40 + t
        propose(d, text, 3)
        text = text + [40 + t, 1]
    d.bets.learn(text)
    assert d.bets.alpha("latest") < 0.1
    assert "weak" not in d.bets.reached  # no majority was ever proposed: its prior stands
    assert d.bets.alpha("weak") == pytest.approx(LookupDrafter.PRIORS["weak"])


class Stepped:
    """A target whose first extra row costs 0.55 of a pass and each further one 0.07 (the F16 GGUF
    curve as a run's estimator read it, results/workloads_f16_auto)."""

    def width_costs(self):
        return np.concatenate([[1.0, 1.0], 1.55 + 0.07 * np.arange(32)])


def test_an_unproven_weak_match_is_no_bet_where_the_first_extra_row_is_dear(monkeypatch):
    weak_seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs: a weak match, nothing seen kept yet
    sure_seq = [3, 4, 5, 6, 7, 8, 9, 2, 0, 3, 4, 5, 6, 7, 8, 9]  # a 7-token match
    d = LookupDrafter(min_match=3)
    d.bets.cost = Stepped()
    assert propose(d, weak_seq, 4) == [] and d.last_kind == "weak"  # E(3) 1.62 tokens for 1.69 passes
    d.bets.reset()
    assert propose(d, sure_seq, 4) == [2, 0, 3] and d.last_kind == "sure"  # at 0.5 a depth it pays
    # at the bets' flat prior (0.5 for every kind) the weak match was bet on: 1.875 tokens for 1.69
    monkeypatch.setattr(LookupDrafter, "PRIORS", {})
    flat = LookupDrafter(min_match=3)
    flat.bets.cost = Stepped()
    assert propose(flat, weak_seq, 4) == [7, 8, 9]


def test_longest_match_wins_over_a_later_shorter_one():
    #            longest earlier match of the suffix [3, 4, 5] is at 0..2 (continues 6 7);
    #            [4, 5] alone also occurs later (continues 9)
    seq = [3, 4, 5, 6, 7, 0, 4, 5, 9, 1, 3, 4, 5]
    assert propose(LookupDrafter(min_match=2), seq, 2) == [6, 7]


def test_candidates_ranked_by_how_often_they_followed():
    seq = [1, 2, 7, 0, 1, 2, 8, 0, 1, 2, 7, 0, 1, 2]
    d = LookupDrafter(min_match=2, max_match=2)
    n, cands = d.candidates(seq, 2)
    assert n == 2 and cands == [[[7, 0], 2], [[8, 0], 1]]
    assert propose(d, seq, 3) == [7, 0, 1]  # majority 7 (2 of 3), then the two 7-continuations agree


def test_draft_stops_where_continuations_part():
    # "1 2" was followed by 3 4 5 and by 3 4 6: agree on 3 4, part at the third token
    seq = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2]
    assert propose(LookupDrafter(min_match=2, max_match=2), seq, 8) == [3, 4]
    # with one occurrence only, it drafts up to k
    assert propose(LookupDrafter(min_match=2, max_match=2), [1, 2, 3, 4, 5, 0, 1, 2], 3) == [3, 4, 5]


def test_short_matches_that_keep_failing_are_dropped():
    d = LookupDrafter(min_match=2, max_match=4, sure_match=4, max_candidates=32)
    seq = [1, 2, 9] * 8 + [1, 2]
    assert propose(d, seq, 1) == [9]  # a 4-token match: sure enough, never gated
    for i in range(4):  # each time the 2-token match "1 2" predicts 9, the target writes another token
        seq = seq + [50 + i, 1, 2]
        assert propose(d, seq, 1) == [9]
    seq = seq + [60, 1, 2]
    assert propose(d, seq, 1) == []  # 0 of 4 kept at this match length: no more bets on it
    assert d.tried[2] == 4 and d.kept[2] == 0 and d.tried[4] == 1
    d.trim(0)  # a new run forgets it
    assert propose(d, seq, 1) == [9]


def brute_longest(seq, n_min, n_max):
    last = len(seq) - 1
    for n in range(min(n_max, last), n_min - 1, -1):
        tail = seq[-n:]
        ends = [e for e in range(n - 1, last) if seq[e - n + 1 : e + 1] == tail]
        if ends:
            return n, ends[::-1]
    return 0, []


def test_index_matches_brute_force_and_survives_truncation():
    rng = np.random.default_rng(1)
    for _trial in range(30):
        seq = [int(t) for t in rng.integers(0, 4, size=60)]
        idx = NgramIndex(2, 5)
        for i in range(1, len(seq) + 1):  # grown one token at a time, as a run grows it
            idx.extend(seq[i - 1 : i])
            assert idx.longest_match() == brute_longest(seq[:i], 2, 5)
        cut = int(rng.integers(0, 60))
        idx.truncate(cut)
        fresh = NgramIndex(2, 5)
        fresh.extend(seq[:cut])
        assert idx.tokens == fresh.tokens and idx.ends == fresh.ends


def test_sync_follows_a_sequence_that_is_not_an_extension():
    d = LookupDrafter(min_match=2)
    propose(d, [1, 2, 3, 1, 2], 2)
    assert propose(d, [7, 8, 7, 8, 7], 2) == [8, 7]  # a different text: re-indexed, not appended


def test_load_drafter_and_sampled_q_is_one_hot():
    vocab = load_backend("synthetic", None, None, role="target").vocab
    d = load_drafter("lookup", target_vocab=vocab)
    assert isinstance(d, LookupDrafter) and d.backend is None
    drafts, q = d.propose([1, 2, 3, 1, 2, 3, 1, 2], 2, SamplingParams(1.0), RNG, 10)
    assert drafts == [3, 1] and q[0][3] == 1.0 and q[0].sum() == 1.0


@pytest.mark.parametrize("backend", ["gguf", "torch", "mlx"])
def test_greedy_lookup_equals_plain_on_the_embedded_target(backend):
    skip = skip_unless_installed(backend)
    if skip.args[0]:
        pytest.skip(skip.kwargs["reason"])
    opts = {"dtype": "float32"} if backend == "torch" else None
    pair = Pair.load(backend, "lookup", target_options=opts)
    prompt = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"
    spec = pair.generate(prompt, params=GREEDY, k=6, max_tokens=48)
    plain = pair.plain().generate(prompt, params=GREEDY, k=1, max_tokens=48)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.n_drafted > 0  # it did bet, and was kept exact


def test_a_few_kept_weak_bets_do_not_yet_make_the_next_one(monkeypatch):
    """Weak and latest matches lean on their prior longer (``LookupDrafter.WEIGHTS``: 8 proposals,
    the other kinds 2): two kept 1-token matches do not make the next one a bet where its first
    extra row costs 0.6 of a pass (the prior's weight of 2 would: 1.70 tokens for 1.6 passes)."""
    weak_seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs: a weak match

    def after_two_kept():
        d = LookupDrafter(min_match=3)
        d.bets.cost = Curve(0.6)
        for _ in range(2):
            d.bets.observe("weak", 1, 1, False)  # a weak proposal whose draft was kept
        return propose(d, weak_seq, 4)

    assert after_two_kept() == []  # 1.52 tokens for 1.6 passes
    monkeypatch.setattr(LookupDrafter, "WEIGHTS", {})
    assert after_two_kept() == [7]
