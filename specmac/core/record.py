"""One sequence as the planner sees it (``Record``): each source's running acceptance per kind of
proposal and depth, counted as a survival curve, and how much of the text free sources wrote; and
what the sequences done showed (``Done``), a new one's priors (``specmac.core.planner`` has the why)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specmac.core.drafters import common_prefix

OPTIMISM = 1.64  # standard deviations above the mean acceptance: the rate a try bets on
SHARE_PRIOR = 4  # tokens each way: the prior on the share of an answer free sources will write
MODEL_PRIOR = (0.5, 4.0, True)  # a source's prior where it names none (``Drafter.priors``)
LENGTH = 128  # tokens: the scale of the prior on an answer's length (half of all answers are longer)
KEEP = 0.8  # what the sequences done keep of what they showed at each one more showing it

Key = tuple[str, str]  # (source name, kind of proposal)


class Record:
    """One sequence as the planner sees it: acceptance per (source, kind) and depth, decayed counts
    of proposals that reached depth j and of those accepted there; the tokens written so far and
    how many of them free sources' accepted drafts wrote."""

    def __init__(self, max_tokens: int, owner: Any, priors: Mapping[Key, tuple[float, float, bool]],
                 length: float = LENGTH, share: float = 0.5,
                 shown: Mapping[Key, float] | None = None) -> None:
        self.max_tokens, self.owner = max_tokens, owner  # the planner whose sources and K its steps take
        # the scale of its answer's length (``left``); the share of it free sources leave a model
        self.length, self.share = float(length), float(share)
        # its sources' priors per (source, kind) and what the counts keep from one step to the next
        self.priors, self.decay = priors, float(owner.decay)
        # per (source, kind): the drafts the sequences done showed, behind its prior's mean: a try's
        # optimism narrows with them (``hopeful``), where the record's learning still leans on w
        self.shown = shown or {}
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
        posterior mean plus ``OPTIMISM`` standard deviations (at most 1), the rate a try bets on.
        The prior counts for its weight and the drafts the sequences done showed of it (``shown``):
        a rate many drafts showed has a narrow bound, where the source's weight alone would put a
        high mean's bound at every draft accepted, and a try would bet on it pass after pass."""
        p, w, _ = self.priors.get(key, MODEL_PRIOR)
        w += self.shown.get(key, 0.0)
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

    def left(self, scale: float | None = None) -> float:
        """Tokens the answer is expected to have left: E[min(L, max_tokens) - n | L > n] for
        lengths L with P(L > x) = scale / (scale + x) (default its own ``length``)."""
        n, m, scale = self.n_out, self.max_tokens, self.length if scale is None else scale
        return (scale + n) * math.log((scale + m) / (scale + n)) if n < m else 0.0

    def model_share(self, free: bool) -> float:
        """The share of the tokens left a model can expect to draft for: of the text so far, what
        free sources' accepted drafts did not write (with ``free`` sources beside it), else all of
        it. A prior of ``SHARE_PRIOR`` tokens each way at its ``share``: how much of an answer a
        lookup will copy is not seen in its first few tokens."""
        if not free:
            return 1.0
        prior = 2 * SHARE_PRIOR
        return (self.n_out - self.free_written + prior * self.share) / (self.n_out + prior)

    def info(self) -> dict:
        first = {f"{s}:{k}": float(self.survival((s, k), 1)[1]) for s, k in sorted(self.reached)}
        return {"acceptance": first,
                "free_written": self.free_written, "n_out": self.n_out, "note": self.note}


class Done:
    """What the sequences done showed, for a new one's priors: each source's acceptance per kind
    ([accepted, reached], as ``Record.counts``), the share of their text free sources' drafts did
    not write, and how long their answers ran. What earlier ones showed fades by ``KEEP`` as a later
    one shows the same anew; one that never drafted with a model says nothing of it (``add``)."""

    def __init__(self) -> None:
        self.counts: dict[Key, np.ndarray] = {}
        self.written = np.zeros(2)  # [tokens not written by free sources' drafts, tokens]
        self.lengths: list[tuple[float, int, bool]] = []  # (weight, tokens, ran to its max_tokens)

    def add(self, record: Record, priors: Mapping[Key, tuple[float, float, bool]]) -> None:
        """A sequence done joins them (once: it is settled then). A source it did not try keeps
        what was shown of it where that beats its own prior (``priors``), and fades towards the
        prior where it falls short: a model a few unlucky drafts priced out is tried again."""
        if record.settled:
            return
        record.settled = True
        for key in {*self.counts, *record.counts}:
            count, (a, n) = record.counts.get(key, np.zeros(2)), self.counts.get(key, np.zeros(2))
            if count[1] > 0 or (n > 0 and a / n < priors.get(key, MODEL_PRIOR)[0]):
                self.counts[key] = KEEP * np.array([a, n]) + count
        if record.n_out:
            self.written = KEEP * self.written + (record.n_out - record.free_written, record.n_out)
            self.lengths = [(w * KEEP, n, cut) for w, n, cut in self.lengths if w * KEEP > 0.01]
            self.lengths.append((1.0, record.n_out, record.n_out >= record.max_tokens))

    def share(self) -> float:
        """A new sequence's prior share of its text a model can draft for (0.5 before any is done)."""
        a, n = self.written
        return float((a + SHARE_PRIOR) / (n + 2 * SHARE_PRIOR))

    def length(self, prior: float) -> float:
        """The scale c of answer lengths, P(L > x) = c / (c + x), most likely given the answers done
        (one cut at its max_tokens says only that it ran at least that far) and two of length
        ``prior`` (alone, they make ``prior`` the most likely): a server's answers that run to their
        limit are expected to run on, where the prior alone expects some to end early."""
        if not self.lengths:
            return float(prior)
        c = np.geomspace(1.0, 1e6, 481)
        ll = 2.0 * (np.log(c) - 2.0 * np.log(c + prior))
        for w, n, cut in self.lengths:
            ll += w * (np.log(c) - (1.0 if cut else 2.0) * np.log(c + n))
        return float(c[np.argmax(ll)])
