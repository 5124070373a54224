"""Several streams sharing each pass (``pass_streams``) on the synthetic pair: every stream writes
what it writes alone (greedy, and sampled with the coupled sampler by seed), whether streams join
at once or one after another and whatever the prompt chunks; a planted backend that hands one
lane's rows to another is caught; an error in one stream's drafting ends that stream only.
"""

from __future__ import annotations

import numpy as np
import pytest

from specmac.api import Pair
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.drafters import ModelDrafter
from specmac.core.loop import Event, pass_streams
from specmac.core.planner import Planner
from specmac.core.sampling import SamplingParams

PROMPTS = ["hello world", "abc def ghi jkl", "the quick brown fox", "lorem ipsum dolor", "x = 1\ny = 2\n"]
GREEDY = SamplingParams(0.0)
COUPLED = SamplingParams(0.9, sampler="coupled")


def alone(pair: Pair, prompts, params, k, max_tokens=30) -> list[list[int]]:
    return [pair.generate(p, params=params, max_tokens=max_tokens, k=k, seed=7 + i, reuse=False).token_ids
            for i, p in enumerate(prompts)]


def together(pair: Pair, prompts, params, k, *, n_lanes=4, chunk=3, join_every=0, max_tokens=30):
    """The prompts served by lanes sharing passes: at most ``n_lanes`` at once, a new one joining
    every ``join_every`` passes (0: as soon as a lane is free), prompts read ``chunk`` tokens a pass.
    -> each prompt's tokens, the passes, each prompt's accepted drafts."""
    lanes = pair.lanes(n_lanes)
    planner = k if isinstance(k, Planner) else pair.planner(k)
    waiting = list(enumerate(prompts))
    running: dict[int, tuple] = {}  # prompt index -> (lane, stream)
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    accepted = [0] * len(prompts)
    n_pass = 0
    while waiting or running:
        free = [lane for lane in lanes if all(lane is not r[0] for r in running.values())]
        if waiting and free and (not join_every or n_pass % join_every == 0):
            i, p = waiting.pop(0)
            running[i] = (free[0], pair.start(free[0], pair.encode(p), params=params, max_tokens=max_tokens,
                                              k=planner, seed=7 + i))
        order = list(running)
        events = pass_streams(lanes[0].target, [running[i][1] for i in order], planner,
                              {j: chunk for j in range(len(order))})
        n_pass += 1
        for i, e in zip(order, events):
            if isinstance(e, Exception):
                raise e
            if isinstance(e, Event):
                out[i] += e.tokens
                accepted[i] += e.n_accepted
                if e.finish_reason:
                    running.pop(i)[1].close()
    return [out[i] for i in range(len(prompts))], n_pass, accepted


@pytest.mark.parametrize("params", [GREEDY, COUPLED], ids=["greedy", "coupled"])
@pytest.mark.parametrize("draft, k", [(None, 4), ("synthetic", 4), ("lookup+synthetic", "auto"),
                                      ("lookup", 4)])
@pytest.mark.parametrize("join_every", [0, 3])
def test_streams_sharing_passes_write_what_each_writes_alone(params, draft, k, join_every):
    pair = Pair.load("synthetic", draft)
    ref = alone(pair, PROMPTS, params, k)
    got, _, _ = together(pair, PROMPTS, params, k, join_every=join_every)
    assert got == ref


def test_plain_batching_takes_fewer_passes_than_tokens():
    pair = Pair.load("synthetic", None)
    got, n_pass, _ = together(pair, PROMPTS[:4], GREEDY, 4, max_tokens=40)
    assert sum(map(len, got)) >= 2.5 * n_pass


class SwappedRows(SyntheticBackend):
    """Planted: the pass hands the first lane's rows to the second and back (a lane mix-up)."""

    def score_many(self, asks):
        rows = super().score_many(asks)
        idx = [j for j, (_, _, want) in enumerate(asks) if want]
        if len(idx) >= 2:
            a, b = idx[0], idx[1]
            n = min(len(rows[a]), len(rows[b]))
            ra, rb = rows[a].copy(), rows[b].copy()
            rows[a][:n], rows[b][:n] = rb[:n], ra[:n]
        return rows


def test_the_check_catches_a_pass_that_mixes_lanes():
    pair = Pair(SwappedRows(), [])
    ref = alone(pair, PROMPTS[:4], GREEDY, 4)
    got, _, _ = together(pair, PROMPTS[:4], GREEDY, 4)
    assert got != ref


def test_an_error_in_one_stream_ends_that_stream_only():
    pair = Pair.load("synthetic", "synthetic")
    lanes = pair.lanes(2)
    planner = pair.planner(4)
    streams = [pair.start(lane, pair.encode(p), params=GREEDY, max_tokens=10, k=planner, seed=1)
               for lane, p in zip(lanes, PROMPTS)]

    def broken(*a, **kw):
        raise RuntimeError("planted")
    streams[1].sources[0].draft = streams[1].sources[0].drafting = broken  # alone, or drafting with others
    events = pass_streams(lanes[0].target, streams, planner)  # the prompts
    events = pass_streams(lanes[0].target, streams, planner)
    assert isinstance(events[0], Event) and isinstance(events[1], RuntimeError)


class Counted(SyntheticBackend):
    """Counts the lanes each ``score_many`` asks rows of (every lane a copy of one backend)."""

    calls: list[int] = []

    def score_many(self, asks):
        Counted.calls.append(sum(1 for _, _, rows in asks if rows))
        return super().score_many(asks)


class SwappedDrafts(Counted):
    """Planted: the draft's shared pass hands the first lane's rows to the second and back."""

    def score_many(self, asks):
        rows = super().score_many(asks)
        idx = [j for j, (_, tokens, want) in enumerate(asks) if want and len(tokens) == 1]
        if len(idx) >= 2:
            rows[idx[0]], rows[idx[1]] = rows[idx[1]], rows[idx[0]]
        return rows


def test_drafts_of_several_streams_share_the_draft_models_passes(monkeypatch):
    """The model drafts for every stream in one pass per draft position, and drafts what it drafts
    alone: each stream accepts as many drafts as it does alone."""
    pair = Pair(Counted(role="target"), [ModelDrafter(Counted(role="draft", noise=0.3))])
    ref = alone_accepted(pair)
    Counted.calls.clear()
    got = together(pair, PROMPTS[:4], GREEDY, 4)[2]
    assert sum(ref) > 0 and got == ref
    assert max(Counted.calls) >= 3  # a draft pass held three streams or more


def test_a_shared_draft_pass_is_timed_with_its_lanes_apart_from_one_streams():
    """Each pass the model drafts for several streams at once is told to the costs with its number
    of lanes (the synthetic draft's pass costs 2 ms a token here), and not as one stream's passes:
    the one-stream price stays what one stream's pass costs."""
    slow = Counted(role="draft", noise=0.3, latency_ms=2.0, beta=1.0)
    pair = Pair(Counted(role="target"), [ModelDrafter(slow)])
    planner = pair.planner(4)
    together(pair, PROMPTS[:4], GREEDY, planner)
    wide = planner.costs.draft_wide["synthetic"]
    assert max(wide) >= 3 and all(n >= 1 for n, _ in wide.values())
    assert planner.costs.draft("synthetic", 4) >= 0.006  # three lanes or more: 6 ms a pass or more
    assert 0.002 <= planner.costs.draft("synthetic") < 0.004  # one lane: 2 ms a pass


def test_a_server_times_drafting_for_its_lanes_before_any_request():
    """``time_shared_drafting`` times the draft's pass for two lanes and for all of them (the
    synthetic draft's pass costs 2 ms a token, so 4 ms and 8 ms), tells the costs with their lanes,
    and leaves every draft lane empty; a pass drafting for three is priced between them, not as
    three one-stream passes would be before any shared pass was timed."""
    from specmac.core.costs import Costs
    from specmac.tuning.timing import time_shared_drafting

    slow = Counted(role="draft", noise=0.3, latency_ms=2.0, beta=1.0)
    pair = Pair(Counted(role="target"), [ModelDrafter(slow)])
    lanes = pair.lanes(4)
    costs = Costs([0.01, 0.011], {"synthetic": 0.002})
    assert costs.draft("synthetic", 3) == pytest.approx(0.006)  # untimed: a pass per lane
    time_shared_drafting(lanes, costs, context=8)  # eight passes timed at each number of lanes
    assert sorted(costs.draft_wide["synthetic"]) == [2, 4]
    assert 0.004 <= costs.draft("synthetic", 2) < 0.006 and 0.008 <= costs.draft("synthetic", 4) < 0.011
    assert all(lane.sources[0].backend.n_past == 0 for lane in lanes)
    assert costs.draft("synthetic") == pytest.approx(0.002)  # one stream's price untouched
    # told as the passes it timed: two passes of four lanes slowed to three times their cost later
    # move the price to 1.4 times (eight at rest against two), not to twice it as one would
    at_rest = costs.draft("synthetic", 4)
    costs.observe_draft("synthetic", 2, 2 * 3 * at_rest, lanes=4)
    assert costs.draft("synthetic", 4) < 1.8 * at_rest


def test_the_check_catches_drafts_handed_to_the_wrong_stream():
    pair = Pair(Counted(role="target"), [ModelDrafter(SwappedDrafts(role="draft", noise=0.3))])
    ref = alone_accepted(pair)
    assert together(pair, PROMPTS[:4], GREEDY, 4)[2] != ref


def alone_accepted(pair) -> list[int]:
    return [pair.generate(p, params=GREEDY, max_tokens=30, k=4, reuse=False).stats.n_accepted
            for p in PROMPTS[:4]]


def test_lanes_hold_their_own_sequences():
    pair = Pair.load("synthetic", "synthetic")
    lanes = pair.lanes(3)
    assert len(lanes) == 3 and lanes[0].target is pair.target
    assert len({id(lane.sources[0].backend) for lane in lanes}) == 3  # each lane its own draft cache
    t = [lane.target for lane in lanes]
    rows = t[0].score_many([(t[0], [1, 2, 3], True), (t[2], [4, 5], True), (t[1], [6], False)])
    assert rows[2] is None and [x.n_past for x in t] == [3, 1, 2]
    assert [x.held for x in t] == [[1, 2, 3], [6], [4, 5]]
    assert np.array_equal(rows[1], SyntheticBackend().score([4, 5]))  # as that sequence alone
    t[2].rewind(1)
    assert t[2].held == [4] and t[0].held == [1, 2, 3]


def test_a_shared_pass_is_timed_with_the_loops_work_on_its_rows(monkeypatch):
    """A step alone times its pass and the rule's work on its rows together; a pass of several
    streams is timed the same way, or a wide one (many rows to check) would look as cheap as its
    forward and the planner would bet on widths that cost more than it reckons."""
    import time

    from specmac.core.loop import Stream

    pair = Pair.load("synthetic", "lookup", target_options={"latency_ms": 1})
    lanes = pair.lanes(2)
    planner = pair.planner(4)
    streams = [pair.start(lane, pair.encode(p), params=GREEDY, max_tokens=10, k=planner, seed=1)
               for lane, p in zip(lanes, PROMPTS)]
    pass_streams(lanes[0].target, streams, planner)  # the prompts (not timed into T)
    real = Stream.take

    def slow_take(self, *a, **kw):
        time.sleep(0.05)  # the loop's work on this stream's rows
        return real(self, *a, **kw)
    monkeypatch.setattr(Stream, "take", slow_take)
    n0, t0 = planner.costs.n_seen.sum(), planner.costs.t_seen.sum()
    pass_streams(lanes[0].target, streams, planner)
    assert planner.costs.n_seen.sum() - n0 == 1  # the pass, observed once
    assert planner.costs.t_seen.sum() - t0 >= 0.1  # both streams' work, not the forward's 1 ms
