"""The lookup drafter: its index against a brute-force reference, its proposals and their kinds,
what the planner bets on them, and exactness."""

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends import load_backend
from specmac.core.costs import Costs
from specmac.core.drafters import OneHotRows
from specmac.core.lookup import LookupDrafter
from specmac.core.planner import Planner
from specmac.core.sampling import SamplingParams
from specmac.core.sources import load_sources
from tests.support.helpers import skip_unless_installed

GREEDY = SamplingParams(0.0)


def propose(d, seq, k):
    return d.propose(list(seq), k)[0]


def test_prompt_lookup_cases_like_llama_cpp_python():
    # the cases of llama-cpp-python's prompt-lookup test, with a 2-token minimum match
    d = LookupDrafter(min_match=2, sure_match=3, max_match=3)
    assert d.propose([1, 2, 3, 1, 2, 3, 1, 2, 3], 2) == ([1, 2], "sure")
    assert LookupDrafter(min_match=2, sure_match=3, max_match=3).propose([1, 2, 3, 4, 5, 6], 2) == ([], "")


def test_proposals_name_the_kind_of_match():
    """Under ``min_match`` a match is "weak"; a weak match whose continuations agree on nothing
    proposes its latest continuation (as the n-gram drafter does), "latest"; the planner, not the
    lookup, decides which of them to bet on."""
    d = LookupDrafter(min_match=2)
    assert d.propose([5, 1, 7, 8, 9, 1], 4) == ([7, 8, 9, 1], "weak")  # only "1" recurs
    assert d.propose([5, 1, 7, 8, 9, 5, 1], 4) == ([7, 8, 9, 5], "short")  # "5 1" recurs
    parted = [1, 7, 0, 2, 1, 8, 3, 1]  # "1" was followed by 7 and by 8
    assert d.propose(parted, 3) == ([8, 3, 1], "latest")
    sure = [3, 4, 5, 6, 7, 8, 9, 2, 0, 3, 4, 5, 6, 7, 8, 9]  # a 7-token match
    assert d.propose(sure, 4) == ([2, 0, 3, 4], "sure")
    assert d.propose([1, 2, 3], 4) == ([], "")  # nothing recurs


def curve(beta):
    """Costs of a step over n tokens, 1 + beta (n - 1) target passes, n = 1..33."""
    return Costs(list(1.0 + beta * np.arange(33.0)))


def stepped():
    """A target whose first extra row costs 0.55 of a pass and each further one 0.07 (the shape of an
    F16 GGUF target's curve as a run's estimator reads it: one step, then nearly flat)."""
    return Costs([1.0, *(1.55 + 0.07 * np.arange(32))])


def bet(seq, k, costs=None, fixed=None, record=None, d=None):
    """The drafts a planner over one lookup verifies after ``seq`` (k drafts at most)."""
    d = d or LookupDrafter(min_match=3)
    planner = Planner([d], costs, k=fixed)
    record = record or planner.record(100)
    drafts, kind = d.propose(seq, k)
    src, width = planner.choose(record, [(0, drafts, kind)] if drafts else [], {}, k)
    return drafts[:width] if src is not None else []


def test_weak_matches_are_bet_on_only_where_costs_are_known():
    # k="auto" (the bets priced by the measured curve): a 1-token match is a bet like any other
    seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs
    parted = [1, 7, 0, 2, 1, 8, 3, 1]  # "1" was followed by 7 and by 8: the latest continuation
    assert bet(seq, 4, curve(0.0)) == [7, 8, 9, 1]  # every width costs one pass: any draft may pay
    assert bet(parted, 3, curve(0.0)) == [8, 3, 1]
    # a fixed K (no costs): no bet on a weak or latest match; a short match is one
    assert bet(seq, 4, fixed=4) == [] and bet(parted, 3, fixed=3) == []
    assert bet([5, 1, 7, 8, 9, 5, 1, 7], 4, fixed=4, d=LookupDrafter(min_match=2)) == [8, 9, 5, 1]
    # a serial target (each width costs its tokens): the unproven weak bet is cut to nothing
    assert bet(parted, 3, curve(1.0)) == []


def test_weak_and_latest_bets_are_kept_apart():
    """The planner keeps each kind of the lookup's proposals on its own record: the latest
    continuations the target keeps rejecting do not condemn the weak matches."""
    d = LookupDrafter(min_match=3)
    planner = Planner([d], curve(0.0))
    record = planner.record(100)
    text = [1, 7, 0, 2, 1, 8, 3, 1]
    for t in range(20):  # each latest-continuation bet is rejected: the target writes 40 + t
        drafts, kind = d.propose(text, 3)
        assert kind == "latest"
        offers = [(0, drafts, kind)]
        choice = planner.choose(record, offers, {}, 3)
        used = drafts[:choice[1]] if choice[0] is not None else []
        planner.observe(record, offers, choice, used, [40 + t], 0, 0.0, 1.0)
        text = text + [40 + t, 1]
    assert record.survival(("lookup", "latest"), 1)[1] < 0.1
    assert ("lookup", "weak") not in record.reached  # no majority was ever proposed: its prior stands
    assert record.survival(("lookup", "weak"), 1)[1] == pytest.approx(LookupDrafter.priors["weak"][0])


def test_an_unproven_weak_match_is_no_bet_where_the_first_extra_row_is_dear(monkeypatch):
    weak_seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs: a weak match, nothing seen kept yet
    sure_seq = [3, 4, 5, 6, 7, 8, 9, 2, 0, 3, 4, 5, 6, 7, 8, 9]  # a 7-token match
    assert bet(weak_seq, 4, stepped()) == []  # E(3) 1.62 tokens for 1.69 passes
    assert bet(sure_seq, 4, stepped()) == [2, 0, 3]  # at 0.5 a depth it pays
    # at a flat prior (0.5 for every kind) the weak match was bet on: 1.875 tokens for 1.69
    monkeypatch.setitem(LookupDrafter.priors, "weak", (0.5, 2.0, False))
    assert bet(weak_seq, 4, stepped()) == [7, 8, 9]


def test_longest_match_wins_over_a_later_shorter_one():
    #            longest earlier match of the suffix [3, 4, 5] is at 0..2 (continues 6 7);
    #            [4, 5] alone also occurs later (continues 9)
    seq = [3, 4, 5, 6, 7, 0, 4, 5, 9, 1, 3, 4, 5]
    d = LookupDrafter(min_match=2)
    assert propose(d, seq, 2) == [6, 7]
    assert d.longest_match() == (3, [2])


def test_continuations_ranked_by_how_often_they_followed_then_by_recency():
    # "1 2" was followed by 7, 7 and (latest) 8: the majority wins over the latest
    seq = [1, 2, 7, 0, 1, 2, 7, 0, 1, 2, 8, 0, 1, 2]
    d = LookupDrafter(min_match=2, sure_match=2, max_match=2)
    assert propose(d, seq, 3) == [7, 0, 1]  # majority 7 (2 of 3), then the two 7-continuations agree
    # a tie is no majority at agree 0.5; where a tie is enough, the latest continuation wins it
    tie = [1, 2, 7, 0, 1, 2, 8, 0, 1, 2]
    assert propose(LookupDrafter(min_match=2, sure_match=2, max_match=2), tie, 3) == []
    lenient = LookupDrafter(min_match=2, sure_match=2, max_match=2)
    lenient.agree = 0.3
    assert propose(lenient, tie, 3) == [8, 0, 1]


def test_draft_stops_where_continuations_part():
    # "1 2" was followed by 3 4 5 and by 3 4 6: agree on 3 4, part at the third token
    seq = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2]
    assert propose(LookupDrafter(min_match=2, sure_match=2, max_match=2), seq, 8) == [3, 4]
    # with one occurrence only, it drafts up to k
    once = [1, 2, 3, 4, 5, 0, 1, 2]
    assert propose(LookupDrafter(min_match=2, sure_match=2, max_match=2), once, 3) == [3, 4, 5]


def test_short_matches_that_keep_failing_are_dropped():
    """With a fixed K the planner bets on a kind of match while its first drafts are kept as often
    as not: the 2-token match "1 2" keeps predicting 9 and the target keeps writing something else,
    so it stops being bet on while the sure 4-token match still is; a new run forgets it."""
    d = LookupDrafter(min_match=2, max_match=4, sure_match=4)
    d.max_candidates = 32
    planner = Planner([d], k=1)
    record = planner.record(100)

    def step(seq, wrote):
        drafts, kind = d.propose(seq, 1)
        offers = [(0, drafts, kind)] if drafts else []
        choice = planner.choose(record, offers, {}, 1)
        used = drafts if choice[0] is not None else []
        planner.observe(record, offers, choice, used, [wrote], 0, 0.0, 1.0)
        return used, kind

    seq = [1, 2, 9] * 8 + [1, 2]
    assert step(seq, 9) == ([9], "sure")  # a 4-token match: sure, kept
    seq = seq + [9, 50, 1, 2]  # "1 2" after 50: a 2-token match that predicts 9, the target writes 51
    assert step(seq, 51) == ([9], "short")
    seq = seq + [51, 1, 2]
    assert step(seq, 52) == ([], "short")  # 0 of 1 kept at this match length: no more bets on it
    assert step([1, 2, 9] * 8 + [1, 2], 9) == ([9], "sure")  # the sure match is still a bet
    assert step(seq + [52, 1, 2], 53) == ([], "short")
    fresh = planner.record(100)  # a new run forgets it
    drafts, kind = d.propose(seq, 1)
    assert planner.choose(fresh, [(0, drafts, kind)], {}, 1) == (0, 1) and kind == "short"


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
        idx = LookupDrafter(min_match=2, sure_match=5, max_match=5)
        for i in range(1, len(seq) + 1):  # grown one token at a time, as a run grows it
            idx._extend(seq[i - 1 : i])
            assert idx.longest_match() == brute_longest(seq[:i], 1, 5)
        cut = int(rng.integers(0, 60))
        idx.trim(cut)
        fresh = LookupDrafter(min_match=2, sure_match=5, max_match=5)
        fresh._extend(seq[:cut])
        assert idx.tokens == fresh.tokens and idx.ends == fresh.ends
        idx._sync(seq[:cut] + seq[cut + 1:])  # a text that is not an extension: re-indexed
        fresh._extend(seq[cut + 1:])
        assert idx.tokens == fresh.tokens and idx.ends == fresh.ends


def test_sync_follows_a_sequence_that_is_not_an_extension():
    d = LookupDrafter(min_match=2)
    propose(d, [1, 2, 3, 1, 2], 2)
    assert propose(d, [7, 8, 7, 8, 7], 2) == [8, 7]  # a different text: re-indexed, not appended


def test_load_sources_and_sampled_q_is_one_hot():
    vocab = load_backend("synthetic", None, None, role="target").vocab
    (d,) = load_sources("lookup", target_vocab=vocab)
    assert isinstance(d, LookupDrafter) and d.backend is None
    drafts, _ = d.propose([1, 2, 3, 1, 2, 3, 1, 2], 2)
    q = OneHotRows(drafts, 10)  # what the loop verifies a free source's drafts with
    assert drafts == [3, 1] and len(q) == 2 and q[0][3] == 1.0 and q[0].sum() == 1.0


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
    """Weak and latest matches lean on their prior longer (``LookupDrafter.priors``: 8 proposals,
    the other kinds 2): two kept 1-token matches do not make the next one a bet where its first
    extra row costs 0.6 of a pass (the prior's weight of 2 would: 1.70 tokens for 1.6 passes)."""
    weak_seq = [5, 1, 7, 8, 9, 1]  # only "1" recurs: a weak match

    def after_two_kept():
        d = LookupDrafter(min_match=3)
        planner = Planner([d], curve(0.6))
        record = planner.record(100)
        for _ in range(2):
            record.learn(("lookup", "weak"), [7], [7, 8])  # a weak proposal whose draft was kept
        return bet(weak_seq, 4, record=record, d=d, costs=curve(0.6))

    assert after_two_kept() == []  # 1.52 tokens for 1.6 passes
    monkeypatch.setitem(LookupDrafter.priors, "weak", (0.4, 2.0, False))
    assert after_two_kept() == [7]
