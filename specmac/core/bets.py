"""Bets on drafts that cost no pass (prompt lookup, n-gram): each proposal cut to the width that pays.

Making such a draft is free, but verifying it is not: a step over w drafts costs T(w + 1), and on
a target whose batched pass grows nearly linearly with its width (llama.cpp Q4_K_M on a CPU,
results/probes) a weak match's drafts cost more than they win. ``Bets`` keeps a running
acceptance per kind of proposal, learnt from the committed text (how far each proposal would have
been kept, whether it was verified or not, so a kind that was cut to nothing can still earn its
way back), and cuts each proposal to argmax_w E(w) / T(w + 1) over the widths measured, w = 0 (no
bet: a plain step) included (``specmac.core.costs.best_width``). Without costs (a fixed K, which is
the user's) it cuts nothing.

E(w) is not the geometric sum of one acceptance rate: a copied stretch is kept for a while and then
left, so the drafts of one proposal are not independent, and one long kept match would make a
single rate close to 1 and the next bet as wide as the curve allows. Instead the bets keep, per
depth j, how many proposals reached their j-th draft and how many kept it (a survival curve, as
Kaplan and Meier count it): E(w) = 1 + sum_{j<=w} S(j), S(j) the product of the kept shares at
depths 1..j. A depth few proposals reached leans on the depth before it (its share is shrunk
towards the previous one's, with the prior's weight), so a width is bet on as far as proposals
were seen to be kept that far. The prior, a share kept at every depth, is per kind where the
drafter knows better than 0.5 (``LookupDrafter.PRIORS``: a 1-token match's first draft is kept 0.40
of the time outside code editing, so on a target whose first extra row costs 0.6 of a pass, F16
GGUF, an unproven weak match is not bet on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specmac.core.costs import best_width


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most ``limit`` (the drafters' one definition)."""
    n = min(len(a), len(b), limit)
    if list(a[:n]) == list(b[:n]):
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))


class Bets:
    """Per-kind survival of free drafts by depth, and the cut that the measured step costs call for."""

    def __init__(self, decay: float = 0.97, prior_alpha: float = 0.5, prior_weight: float = 2.0,
                 priors: dict[str, float] | None = None, weights: dict[str, float] | None = None) -> None:
        self.decay, self.prior_alpha, self.prior_weight = decay, prior_alpha, prior_weight
        # per kind: the share assumed kept at each depth before the run shows any (else prior_alpha);
        # a drafter's kinds differ (a lookup's 1-token match is kept far less often than a long one)
        self.priors = dict(priors or {})
        # per kind: the prior's weight, in proposals (else prior_weight): a kind whose proposals differ
        # much from one another leans on its prior longer than a few kept ones would let it
        self.weights = dict(weights or {})
        # the K policy whose width_costs() gives [n] seconds of a step over n tokens, measured widths
        # only (an AdaptiveK, set per run by the API); None: no cut
        self.cost: Any = None
        self.reset()

    def reset(self) -> None:
        # per kind: [depth j - 1] decayed counts of proposals that reached their j-th draft, and kept it
        self.reached: dict[str, np.ndarray] = {}
        self.kept: dict[str, np.ndarray] = {}
        self._pending: list[tuple[int, str, list[int]]] = []
        self.n_cut = self.n_declined = 0  # proposals cut shorter, and cut to nothing, in this run

    def observe(self, key: str, kept: int, drafted: int, rejected: bool) -> None:
        """One proposal of ``drafted`` drafts of which the first ``kept`` were kept, and the next
        ``rejected`` (else the text stopped or the drafts ran out: nothing known beyond)."""
        depth = max(drafted, len(self.reached.get(key, ())))
        reached = np.zeros(depth)
        kept_ = np.zeros(depth)
        if key in self.reached:
            n = len(self.reached[key])
            reached[:n], kept_[:n] = self.decay * self.reached[key], self.decay * self.kept[key]
        reached[:kept] += 1
        kept_[:kept] += 1
        if rejected and kept < drafted:
            reached[kept] += 1
        self.reached[key], self.kept[key] = reached, kept_

    def survival(self, key: str, m: int) -> np.ndarray:
        """[m + 1] S(j), j = 0..m: the estimated chance that a proposal's first j drafts are all kept."""
        reached = self.reached.get(key, np.zeros(0))
        kept = self.kept.get(key, np.zeros(0))
        s, share, w = np.ones(m + 1), self.prior_of(key), self.weight_of(key)
        for j in range(m):
            if j < len(reached):
                share = (kept[j] + w * share) / (reached[j] + w)
            s[j + 1] = s[j] * share
        return s

    def expected(self, key: str, m: int) -> np.ndarray:
        """[m + 1] E(w), w = 0..m: tokens a step over this kind's first w drafts is expected to commit."""
        return np.cumsum(self.survival(key, m))

    def prior_of(self, key: str) -> float:
        """The share of this kind's drafts assumed kept, a depth, before the run shows any."""
        return self.priors.get(key, self.prior_alpha)

    def weight_of(self, key: str) -> float:
        """The prior's weight for this kind, in proposals."""
        return self.weights.get(key, self.prior_weight)

    def alpha(self, key: str) -> float:
        """The kind's pooled acceptance, kept over reached (the prior's weight added)."""
        r, k = self.reached.get(key, np.zeros(0)).sum(), self.kept.get(key, np.zeros(0)).sum()
        w = self.weight_of(key)
        return float((k + self.prior_of(key) * w) / (r + w))

    def learn(self, seq: Sequence[int]) -> None:
        """Score the pending proposals against the committed text: accepted drafts, and one
        rejection where the text shows one (a shorter text says nothing of the rest)."""
        for n0, key, drafts in self._pending:
            got = seq[n0:n0 + len(drafts)]
            a = common_prefix(got, drafts, len(drafts))
            self.observe(key, a, len(drafts), a < len(drafts) and len(seq) > n0 + a)
        self._pending = []

    def cut(self, seq: Sequence[int], drafts: list[int], key: str) -> list[int]:
        """The proposal as far as it pays at this kind's survival (all of it without costs)."""
        if not drafts:
            return drafts
        self._pending.append((len(seq), key, list(drafts)))
        if self.cost is None:
            return drafts
        w = best_width(self.expected(key, len(drafts)), self.cost.width_costs())
        self.n_cut += w < len(drafts)
        self.n_declined += w == 0
        return drafts[:w]

    def info(self) -> dict:
        return {"bets_cut": self.n_cut, "bets_declined": self.n_declined,
                "bet_alpha": {k: self.alpha(k) for k in sorted(self.reached)}}
