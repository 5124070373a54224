"""Bets on drafts that cost no pass (prompt lookup, n-gram): each proposal cut to the width that pays.

Making such a draft is free, but verifying it is not: a step over w drafts costs T(w + 1), and on
a target whose batched pass grows nearly linearly with its width (llama.cpp Q4_K_M on a CPU,
results/probes) a weak match's drafts cost more than they win. ``Bets`` keeps a running
acceptance per kind of proposal, learnt from the committed text (how far each proposal would have
been kept, whether it was verified or not, so a kind that was cut to nothing can still earn its
way back), and cuts each proposal to argmax_w E(w) / T(w + 1) over the widths measured, w = 0 (no
bet: a plain step) included (``specmac.core.costs.bet_width``). Without costs (a fixed K, which is
the user's) it cuts nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specmac.core.costs import bet_width


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most ``limit`` (the drafters' one definition)."""
    n = min(len(a), len(b), limit)
    if list(a[:n]) == list(b[:n]):
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))


class Bets:
    """Per-kind acceptance of free drafts, and the cut that the measured step costs call for."""

    def __init__(self, decay: float = 0.97, prior_alpha: float = 0.5, prior_weight: float = 2.0) -> None:
        self.decay, self.prior = decay, (prior_alpha * prior_weight, prior_weight)
        # the K policy whose width_costs() gives [n] seconds of a step over n tokens, measured widths
        # only (an AdaptiveK, set per run by the API); None: no cut
        self.cost: Any = None
        self.reset()

    def reset(self) -> None:
        self.acc: dict[str, list[float]] = {}
        self._pending: list[tuple[int, str, list[int]]] = []
        self.n_cut = self.n_declined = 0  # proposals cut shorter, and cut to nothing, in this run

    def alpha(self, key: str) -> float:
        a, n = self.acc.get(key, self.prior)
        return a / n

    def learn(self, seq: Sequence[int]) -> None:
        """Score the pending proposals against the committed text: accepted drafts, and one
        rejection where the text shows one (a shorter text says nothing of the rest)."""
        for n0, key, drafts in self._pending:
            got = seq[n0:n0 + len(drafts)]
            a = common_prefix(got, drafts, len(drafts))
            rejected = a < len(drafts) and len(seq) > n0 + a
            acc = self.acc.setdefault(key, list(self.prior))
            acc[0] = self.decay * acc[0] + a
            acc[1] = self.decay * acc[1] + a + rejected
        self._pending = []

    def cut(self, seq: Sequence[int], drafts: list[int], key: str) -> list[int]:
        """The proposal as far as it pays at this kind's acceptance (all of it without costs)."""
        if not drafts:
            return drafts
        self._pending.append((len(seq), key, list(drafts)))
        if self.cost is None:
            return drafts
        w = bet_width(self.alpha(key), len(drafts), self.cost.width_costs())
        self.n_cut += w < len(drafts)
        self.n_declined += w == 0
        return drafts[:w]

    def info(self) -> dict:
        return {"bets_cut": self.n_cut, "bets_declined": self.n_declined,
                "bet_alpha": {k: self.alpha(k) for k in sorted(self.acc)}}
