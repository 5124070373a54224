"""One sequence as the planner sees it (``Record``): each source's running acceptance per kind of
proposal and depth, counted as a survival curve, and how much of the text free sources wrote
(``specmac.core.planner`` has the why of both)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specmac.core.drafters import common_prefix

OPTIMISM = 1.64  # standard deviations above the mean acceptance: the rate a try bets on
SHARE_PRIOR = 4  # tokens each way: the prior on the share of an answer free sources will write
MODEL_PRIOR = (0.5, 4.0, True)  # a source's prior where it names none (``Drafter.priors``)

Key = tuple[str, str]  # (source name, kind of proposal)


class Record:
    """One sequence as the planner sees it: acceptance per (source, kind) and depth, decayed counts
    of proposals that reached depth j and of those accepted there; the tokens written so far and
    how many of them free sources' accepted drafts wrote."""

    def __init__(self, max_tokens: int, owner: Any, priors: Mapping[Key, tuple[float, float, bool]]) -> None:
        self.max_tokens, self.owner = max_tokens, owner  # the planner whose sources and K its steps take
        # its sources' priors per (source, kind) and what the counts keep from one step to the next
        self.priors, self.decay = priors, float(owner.decay)
        self.reached: dict[Key, np.ndarray] = {}
        self.accepted: dict[Key, np.ndarray] = {}
        # per (source, kind), never decayed: [accepted, reached] of what its prior stands for (the
        # first draft of a free source's proposal; every draft of a source of one rate)
        self.counts: dict[Key, np.ndarray] = {}
        self.n_out = self.free_written = 0
        self.elapsed = self.lost = 0.0  # seconds decoded; seconds model steps lost against plain ones
        self.note = ""  # why a model was not started, where its prefill is what stopped it
        self.settled = False  # its counts have joined the planner's (``Planner.settle``)

    def survival(self, key: Key, m: int) -> np.ndarray:
        """[m + 1] S(j), j = 0..m: the chance that a proposal's first j drafts are all accepted.

        A source of one rate (a model: ``one_rate``) has S(j) = E[alpha^j] under the Beta
        posterior of its pooled counts, prior Beta(p w, (1 - p) w): prod_{i<j} (A + i) / (A + B + i)
        with A its accepted drafts and B its rejections, each plus the prior's. Its heavier tail
        than alpha^j at the mean keeps one rejection after a run of acceptances from cutting a wide
        K to a narrow one. A free source's kinds are run lengths (a copied stretch is accepted for a
        while, then left): depth j's share is its own counts shrunk, with the prior's weight w,
        towards the share at the depth before it (p before the first)."""
        p, w, one_rate = self.priors.get(key, MODEL_PRIOR)
        reached, accepted = self.reached.get(key), self.accepted.get(key)
        if one_rate:
            return self.pooled([key], m, p, w)
        s, share = np.ones(m + 1), p
        for j in range(m):
            if reached is not None and j < len(reached):
                share = (accepted[j] + w * share) / (reached[j] + w)
            s[j + 1] = s[j] * share
        return s

    def pooled(self, keys: Sequence[Key], m: int, p: float = MODEL_PRIOR[0],
               w: float = MODEL_PRIOR[1]) -> np.ndarray:
        """[m + 1] E[alpha^j], j = 0..m, for ``keys`` taken as one rate: the Beta posterior of their
        pooled accepted drafts and rejections, prior Beta(p w, (1 - p) w)."""
        a, b = p * w, (1 - p) * w
        for key in keys:
            if key in self.reached:
                a += self.accepted[key].sum()
                b += self.reached[key].sum() - self.accepted[key].sum()
        i = np.arange(m, dtype=float)
        return np.concatenate([[1.0], np.cumprod((a + i) / (a + b + i))])

    def hopeful(self, key: Key, m: int) -> np.ndarray:
        """[m + 1] alpha^j, j = 0..m, at an optimistic acceptance of a source of one rate: its
        posterior mean plus ``OPTIMISM`` standard deviations (at most 1), the rate a try bets on."""
        p, w, _ = self.priors.get(key, MODEL_PRIOR)
        a, b = p * w, (1 - p) * w
        if key in self.reached:
            a += self.accepted[key].sum()
            b += self.reached[key].sum() - self.accepted[key].sum()
        n = a + b
        high = min(a / n + OPTIMISM * math.sqrt(a * b / (n * n * (n + 1.0))), 1.0)
        return high ** np.arange(m + 1.0)

    def learn(self, key: Key, drafts: Sequence[int], committed: Sequence[int]) -> None:
        """A proposal against what the step committed: accepted as far as they agree, rejected at
        the first difference, unknown beyond the committed tokens."""
        if not drafts:
            return
        kept = common_prefix(drafts, committed, len(drafts))
        depth = kept + (kept < len(drafts) and kept < len(committed))
        if key not in self.reached:
            self.reached[key], self.accepted[key] = np.zeros(0), np.zeros(0)
        if depth > len(self.reached[key]):
            grow = depth - len(self.reached[key])
            self.reached[key] = np.concatenate([self.reached[key], np.zeros(grow)])
            self.accepted[key] = np.concatenate([self.accepted[key], np.zeros(grow)])
        self.reached[key][:depth] += 1
        self.accepted[key][:kept] += 1
        one_rate = self.priors.get(key, MODEL_PRIOR)[2]
        count = self.counts.setdefault(key, np.zeros(2))
        count += (kept, depth) if one_rate else (kept > 0, depth > 0)

    def advance(self, n_new: int, free_accepted: int) -> None:
        """A step wrote ``n_new`` tokens, ``free_accepted`` of them a free source's accepted drafts."""
        for key in self.reached:
            self.reached[key] *= self.decay
            self.accepted[key] *= self.decay
        self.n_out += n_new
        self.free_written += free_accepted

    def left(self, scale: float) -> float:
        """Tokens the answer is expected to have left: E[min(L, max_tokens) - n | L > n] for
        lengths L with P(L > x) = scale / (scale + x)."""
        n, m = self.n_out, self.max_tokens
        return (scale + n) * math.log((scale + m) / (scale + n)) if n < m else 0.0

    def model_share(self, free: bool) -> float:
        """The share of the tokens left a model can expect to draft for: of the text so far, what
        free sources' accepted drafts did not write (with ``free`` sources beside it), else all of
        it. A prior of ``SHARE_PRIOR`` tokens each way: how much of an answer a lookup will copy is
        not seen in its first few tokens."""
        if not free:
            return 1.0
        return (self.n_out - self.free_written + SHARE_PRIOR) / (self.n_out + 2 * SHARE_PRIOR)

    def info(self) -> dict:
        first = {f"{s}:{k}": float(self.survival((s, k), 1)[1]) for s, k in sorted(self.reached)}
        return {"acceptance": first,
                "free_written": self.free_written, "n_out": self.n_out, "note": self.note}
