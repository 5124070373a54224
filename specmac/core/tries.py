"""Tries: where no option pays at the means, a model step bet at an optimistic acceptance
(``Record.hopeful``), within a budget of the time decoded, so a model whose prior undersells it
is still found, and trying never costs more than a few percent of a run.

A sequence alone tries from its own budget (``try_alone``): ``BUDGET`` of the time it decoded (or,
if more, of plain decoding over its tokens left), less what its model steps lost so far. A batch
whose model pays only shared by all of it (one sequence's lane alone would delay the pass for
all the others) tries all of them on it at once (``try_together``), from the budget of every pass
its planner ran (``Ledger``: a server's, over all its requests, since what the try shows joins
the priors of the requests after it).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

BUDGET = 0.03  # of a run's time: what trying a model that pays only at a higher acceptance may lose


class Ledger:
    """The seconds a planner's passes ran, and what they lost against plain passes (gains count
    back), over all its sequences."""

    def __init__(self) -> None:
        self.ran = self.lost = 0.0

    def add(self, seconds: float, n_batch: int, tokens: int | None = None, plain: float = 0.0) -> None:
        """One sequence's step in a pass of ``n_batch`` that took ``seconds`` (its drafting
        included): its share of the pass; a model's step (``tokens`` written, where a plain pass
        of them all takes ``plain``) its share of what the pass lost too, (seconds - tokens *
        plain) / n_batch (summed over a pass of model steps: its seconds less its tokens at a plain
        pass's price per token). Plain steps and free sources' bets lose nothing here: a slow pass
        of them (a prompt read in a step's pass, a neighbour's burst) is no try's cost."""
        n = max(n_batch, 1)
        self.ran += seconds / n
        if tokens is not None:
            self.lost += (seconds - tokens * plain) / n

    def budget(self, horizon: float) -> float:
        """Seconds a try may still lose: ``BUDGET`` of the time run (or, if more, ``horizon``, the
        plain passes the tokens left will take), less what was lost."""
        return BUDGET * max(self.ran, horizon) - self.lost


def reading(costs, name: str, n_behind: int) -> float:
    """Seconds the draft model ``name`` takes to read the ``n_behind`` tokens it has not seen: a
    try's worst case pays it whole (a catch-up of one or two tokens is its drafting's, not this)."""
    return n_behind * costs.prefill(name) if n_behind > 2 else 0.0


def try_alone(planner, record, offers, behind: Mapping[int, int], room: int, batch: tuple | None = None):
    """Where no option pays at the means: the model step that pays best at an optimistic
    acceptance, priced as any model step is, tried where its worst case (every draft rejected)
    fits the run's budget: ``BUDGET`` of the time decoded (or, if more, of plain decoding over the
    tokens left), less what model steps lost so far. A draft that cannot pay even always accepted
    is never tried. ``batch``: the other sequences of the pass as planned (their widths, expected
    tokens, drafting seconds, and the pass's seconds for a list of widths): the try pays at the
    pass's rate, and what its worst case delays the pass by counts for every sequence waiting on
    it. -> (source, K) or None."""
    t = planner.costs.curve()
    budget = BUDGET * max(record.elapsed, record.left() * t[1]) - record.lost
    lens, got, spent, seconds = batch or ([], 0.0, 0.0, lambda ws: float(planner.pass_seconds(sum(ws))))
    base = seconds([*lens, 1]) + spent
    best, pick = (got + 1.0) / base, None
    for i, n_behind in behind.items():
        ks = planner.model_widths(record, i, n_behind, room)
        if ks is None:
            continue
        ex, _, passes, share = planner.model_step(record, i, n_behind, ks)
        name = planner.sources[i].name
        hope = np.cumsum(record.hopeful((name, "model"), int(ks[-1])))[ks]
        width = (planner.pass_seconds(ks + 1) if batch is None  # alone: one forward over its width
                 else np.array([seconds([*lens, 1 + int(k)]) for k in ks]) + spent)
        rate = (got + hope) / (passes + width + hope * (share / ex))  # a hopeful step, its prefill share
        prefill = reading(planner.costs, name, n_behind)
        ok = (rate > best) & ((passes + width - base + prefill) * (len(lens) + 1) <= budget)
        if ok.any():
            j = int(np.argmax(np.where(ok, rate, -1.0)))
            best, pick = float(rate[j]), (i, int(ks[j]))
    return pick


def try_together(planner, asks, opts, names, alike: list[list[int]], pick: list[int], rate, seconds,
                 paid) -> list[int]:
    """Where no sequence of a batch drafts with a model: all of them on one shared model at one K
    (``alike``, option indices per sequence into ``opts``, ``Planner.plan``'s options) that beats
    ``pick`` at an optimistic acceptance, the one whose worst case (every draft rejected, every
    prefill read) costs least, where that fits the planner's ``Ledger`` budget over the plain
    passes the longest answer has left. The cheapest, not the one that would pay most: a try buys
    the model's acceptance, which its first drafts show as well as a wide K's, and a wide K pays
    only at the optimistic acceptance. ``rate``, ``seconds``, ``paid``: the plan's pricing."""
    lens = [1 + int(opts[j][1][i]) for j, i in enumerate(pick)]
    base = seconds(lens) + paid(pick)[0]
    budget = planner.ledger.budget(max(a[0].left() for a in asks) * seconds([1] * len(asks)))
    plan, out, least = rate(pick), pick, budget
    for a in alike:
        keys = [(names[j][i], int(opts[j][1][i])) for j, i in enumerate(a)]
        spent = seconds([1 + k for _, k in keys]) + paid(a)[0]
        read = sum(reading(planner.costs, x, ask[2][opts[j][0][i]])
                   for j, (ask, (x, _), i) in enumerate(zip(asks, keys, a)))
        worst = spent - sum(float(opts[j][4][i]) for j, i in enumerate(a)) + read - base
        if worst > least:
            continue  # past the budget, or dearer than a try already found
        hope = sum(float(np.cumsum(ask[0].hopeful((x, "model"), k))[k]) for ask, (x, k) in zip(asks, keys))
        if hope / spent > plan:
            out, least = a, worst
    return out
