"""Prompt lookup that bets only when it should (``--draft lookup``): no model, pure numpy.

An index of every n-gram of the committed text (prompt and output), keyed by the n-gram for each
length n in weak_match..max_match and holding the positions where it ended, is updated as the text
grows (a few dict insertions a token, never a rescan). A step looks up the longest suffix of the
text that occurred before; the occurrences' continuations are candidate drafts, ranked by how
often each token followed (ties: the latest). The draft follows the majority while more than
``agree`` of the still-consistent continuations agree, and stops where they part, so its length
comes from how far earlier continuations agree. Where short matches (under ``sure_match``) have
kept being rejected in this run, it proposes nothing: the step is a plain one and costs what
plain decoding costs. Under ``k="auto"`` a proposal is also cut to the width its kind's running
acceptance pays for on the measured step costs (``specmac.core.bets``; weak, short and sure
matches apart, and the latest continuation of a weak match whose continuations agree on nothing),
so a weak match is not verified where the wider pass costs more than it wins. Weak matches (from
``weak_match`` to under ``min_match`` tokens) are bet on only there (or where a hybrid's choice
weighs them, ``priced``): with a fixed K, which no costs weigh, a match under ``min_match``
proposes nothing. On a target whose wide pass costs
about one token (torch bf16 on a CPU, results/probes_wide) a 1-token match's guess pays; on a
llama.cpp Q4_K_M target the bets cut it away.

The drafter learns what was kept from the next committed sequence (the part of its last draft
that the target kept), so it needs nothing from the loop beyond the contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmac.core.bets import Bets
from specmac.core.drafters import FACTORIES, Drafter, OneHotRows, _common_prefix


class NgramIndex:
    """n-gram -> end positions (ascending) for n in [n_min, n_max], over a growing token list."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.ends: list[dict[tuple, list[int]]] = [{} for _ in range(n_max + 1)]

    def extend(self, new: Sequence[int]) -> None:
        for t in new:
            self.tokens.append(int(t))
            i = len(self.tokens) - 1
            for n in range(self.n_min, min(self.n_max, i + 1) + 1):
                self.ends[n].setdefault(tuple(self.tokens[i - n + 1 : i + 1]), []).append(i)

    def truncate(self, m: int) -> None:
        """Forget every token from position m on (and the n-grams ending there)."""
        for i in range(len(self.tokens) - 1, m - 1, -1):
            for n in range(self.n_min, min(self.n_max, i + 1) + 1):
                key = tuple(self.tokens[i - n + 1 : i + 1])
                ends = self.ends[n][key]
                ends.pop()  # i is the last end of its key: later ones went first
                if not ends:
                    del self.ends[n][key]
        del self.tokens[m:]

    def longest_match(self) -> tuple[int, list[int]]:
        """(n, earlier end positions) of the longest suffix of the text (n <= n_max) that occurred
        before, the latest first; (0, []) when even n_min tokens never did."""
        last = len(self.tokens) - 1
        for n in range(min(self.n_max, last), self.n_min - 1, -1):
            ends = self.ends[n].get(tuple(self.tokens[last - n + 1 :]))
            if ends and len(ends) > 1:
                return n, ends[-2::-1]
        return 0, []


class LookupDrafter(Drafter):
    """Longest earlier match of the text's suffix; drafts as far as its continuations agree."""

    name = "lookup"
    LATEST_FOR = ("weak",)  # kinds of match whose latest continuation is bet on where none agree
    # the bets' prior per kind of match: the share of first drafts kept outside code editing over the
    # packaged workload's greedy texts on the three real targets (`python bench/replay_drafters.py
    # kinds`, results/replay/kinds.md: latest 0.10 of 523, weak 0.40 of 731), never above the bets'
    # 0.5: short and sure matches were kept 0.75 and 0.79, but at priors that high the first long
    # bet's width flips on the Q4_K_M curve's steps (the replay's code editing 2.07x at 0.79, 1.96x at
    # 0.80), where 0.5 lets the run's own proposals widen it
    PRIORS = {"latest": 0.1, "weak": 0.4}
    # the priors' weights, in proposals (else the bets' 2): weak and latest matches differ much from one
    # another (the start of a copied stretch, a word that recurs by chance), and a bet made as soon as a
    # few were kept is made on the luckiest estimate: over the recorded texts their bets on the F16
    # curve of an AMD EPYC were kept 1.89 tokens a step where 2.48 were predicted (short and sure
    # matches: more than predicted). At 8 the lookup alone replays at 1.26x plain on summarization
    # there, 1.14x at 2; no category of the six measured curves loses more than 1.4% (code editing
    # on the EPYC's Q4_K_M curve, 2.08x to 2.05x) (`python bench/replay_drafters.py replay --curves all`)
    WEIGHTS = {"latest": 8.0, "weak": 8.0}

    def __init__(self, min_match: int = 3, max_match: int = 8, agree: float = 0.5,
                 max_candidates: int = 8, sure_match: int = 6, min_accept: float = 0.3,
                 weak_match: int = 1) -> None:
        if not 1 <= weak_match <= min_match <= max_match:
            raise ValueError(f"weak_match {weak_match}, min_match {min_match} and max_match {max_match} are "
                             "out of range: use 1 <= weak_match <= min_match <= max_match")
        self.min_match, self.max_match, self.agree = min_match, max_match, agree
        self.max_candidates, self.sure_match, self.min_accept = max_candidates, sure_match, min_accept
        self.weak_match = weak_match
        self.index = NgramIndex(weak_match, max_match)
        self._pending: tuple[int, int, list[int]] | None = None  # (len(seq), match length, drafts)
        # per match length: first drafts proposed and accepted in this run (for the short-match gate)
        self.tried = np.zeros(max_match + 1)
        self.kept = np.zeros(max_match + 1)
        self.n_proposed = self.n_declined = 0
        self.last_match, self.last_kind = 0, "weak"
        self.bets = Bets(priors=self.PRIORS, weights=self.WEIGHTS)
        # set by a hybrid that prices every proposal in its own choice (k="auto"): weak matches are
        # then proposed, as where the lookup's own bets price them
        self.priced = False

    def max_k(self, n_seq: int) -> int:
        return 1 << 30

    def trim(self, n: int) -> None:
        if n < len(self.index.tokens):
            self.index.truncate(n)
        if n == 0:  # a new run: what was learnt about this text is forgotten
            self.tried[:] = self.kept[:] = 0
            self._pending = None
            self.bets.reset()

    def _sync(self, seq: Sequence[int]) -> None:
        """Index exactly seq: append what is new (the loop only appends between trims)."""
        m = len(self.index.tokens)
        if m > len(seq) or (m and int(seq[m - 1]) != self.index.tokens[-1]):
            m = _common_prefix(self.index.tokens, seq, len(seq))
            self.index.truncate(m)
        self.index.extend(seq[m:])

    def _learn(self, seq: Sequence[int]) -> None:
        """Score the last proposal against what the target kept (its first draft, by match length)."""
        if self._pending is None:
            return
        n0, n, drafts = self._pending
        self._pending = None
        if len(seq) > n0:
            self.tried[n] += 1
            self.kept[n] += int(seq[n0]) == drafts[0]

    def candidates(self, seq: Sequence[int], k: int) -> tuple[int, list[tuple[list[int], int]]]:
        """(match length, [(continuation [<= k], how many occurrences it followed), ...]) ranked
        by count, then by recency: the distinct continuations of the longest earlier match."""
        self._sync(seq)
        n, ends = self.index.longest_match()
        toks = self.index.tokens
        counts: dict[tuple, int] = {}
        for e in ends[: self.max_candidates]:
            cont = tuple(toks[e + 1 : e + 1 + k])
            if cont:
                counts[cont] = counts.get(cont, 0) + 1
        return n, sorted(([list(c), m] for c, m in counts.items()), key=lambda cm: -cm[1])

    def draft(self, seq: Sequence[int], k: int) -> tuple[list[int], int]:
        """(drafts [<= k], match length): the majority continuation while ``agree`` of the
        occurrences still consistent with it agree; [] when no match is worth a bet. Under
        k="auto" a weak match whose continuations agree on nothing bets on its latest one (as the
        n-gram drafter does), a kind of its own (``last_kind``) that its bets keep apart."""
        self._sync(seq)
        n, ends = self.index.longest_match()
        self.last_match, self.last_kind = n, self.kind(n)
        # k="auto": the bets (or a hybrid's choice) weigh every proposal against the costs
        priced = self.priced or self.bets.cost is not None
        if n == 0 or k < 1 or (n < self.min_match and not priced) or self._gated(n):
            return [], n
        toks, L = self.index.tokens, len(self.index.tokens)
        alive = ends[: self.max_candidates]  # latest first
        out: list[int] = []
        for j in range(k):
            nexts = [toks[e + 1 + j] for e in alive if e + 1 + j < L]
            if not nexts:
                break
            counts: dict[int, int] = {}
            for t in nexts:
                counts[t] = counts.get(t, 0) + 1
            best = max(counts, key=lambda t: (counts[t], -nexts.index(t)))  # ties: the latest
            if counts[best] <= self.agree * len(nexts):  # a tie is no majority
                break
            out.append(best)
            alive = [e for e in alive if e + 1 + j < L and toks[e + 1 + j] == best]
        if not out and self.last_kind in self.LATEST_FOR:
            out, self.last_kind = toks[ends[0] + 1 : ends[0] + 1 + k], "latest"
        return out, n

    def _gated(self, n: int) -> bool:
        """A short match that keeps being rejected in this run (its first drafts, Beta(1, 1) prior)."""
        if n >= self.sure_match or n < self.min_match or self.tried[n] < 4:
            return False
        return self.kept[n] + 1 < self.min_accept * (self.tried[n] + 2)

    def kind(self, n: int) -> str:
        """The bets' name for a match of n tokens: weak (under ``min_match``, bet on only where
        costs are known), short (under ``sure_match``) or sure."""
        return "weak" if n < self.min_match else "sure" if n >= self.sure_match else "short"

    def propose(self, seq, k, params, rng, n_vocab, noise=None):  # one-hot: the noise is not needed
        self._learn(seq)
        self.bets.learn(seq)
        drafts, n = self.draft(seq, k)
        if drafts:
            self._pending = (len(seq), n, drafts)  # the gate learns from the whole proposal
            drafts = self.bets.cut(seq, drafts, self.last_kind)
        if drafts:
            self.n_proposed += 1
        else:
            self.n_declined += 1
        return drafts, (None if params.greedy else OneHotRows(drafts, n_vocab))

    def info(self) -> dict:
        return {"drafter": self.name, "weak_match": self.weak_match, "min_match": self.min_match,
                "max_match": self.max_match, "agree": self.agree, "sure_match": self.sure_match,
                "min_accept": self.min_accept, **self.bets.info()}


FACTORIES["lookup"] = LookupDrafter
