"""Prompt lookup with a sense of how sure its match is (``--draft lookup``): no model, pure numpy.

An index of every n-gram of the committed text (prompt and output), for each length n in
1..max_match, holds the positions where it ended; it grows with the text (a few dict insertions a
token, never a rescan). A proposal looks up the longest suffix of the text that occurred before;
the occurrences' continuations are candidates, ranked by how often each token followed (ties: the
latest). The draft follows the majority while more than ``agree`` of the still-consistent
continuations agree and stops where they part, so its length comes from how far earlier
continuations agree. A weak match (under ``min_match`` tokens) whose continuations agree on nothing
proposes its latest continuation.

Each proposal names its kind: "sure" (a match of ``sure_match`` tokens or more), "short", "weak" (under
``min_match``) or "latest". The planner keeps each kind's acceptance apart and weighs its drafts
against the step's costs; ``priors`` says what each kind is worth before a run shows it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specmac.core.drafters import Drafter, common_prefix


class LookupDrafter(Drafter):
    """Longest earlier match of the text's suffix; drafts as far as its continuations agree."""

    name = "lookup"
    # (share of drafts accepted at each depth before the run shows any, its weight in proposals): a
    # 1-token match's continuation is right far less often than a long match's, and weak and latest
    # matches differ much from one another (the start of a copied stretch, a word that recurs by
    # chance), so they lean on their prior longer
    priors = {"sure": (0.5, 2.0, False), "short": (0.5, 2.0, False), "weak": (0.4, 8.0, False),
              "latest": (0.1, 8.0, False)}
    # a match of a token or two is a coincidence where a running model conditions on the whole text:
    # beside a model that pays, the planner bets on these only against a plain step
    guesses = ("weak", "latest")

    agree = 0.5  # the share of the consistent continuations the next draft token needs (a tie is none)
    max_candidates = 8  # the latest occurrences of a match read

    def __init__(self, min_match: int = 3, sure_match: int = 6, max_match: int = 8) -> None:
        if not 1 <= min_match <= sure_match <= max_match:
            raise ValueError(f"min_match {min_match}, sure_match {sure_match} and max_match {max_match} are "
                             "out of range: use 1 <= min_match <= sure_match <= max_match")
        self.min_match, self.sure_match, self.max_match = min_match, sure_match, max_match
        self.tokens: list[int] = []  # the text indexed
        self.ends: list[dict[tuple, list[int]]] = [{} for _ in range(max_match + 1)]  # [n] n-gram -> ends

    def fork(self, backend=None) -> LookupDrafter:
        out = LookupDrafter(self.min_match, self.sure_match, self.max_match)
        out.agree, out.max_candidates = self.agree, self.max_candidates
        return out

    # --- the index ------------------------------------------------------------------------------
    def _extend(self, new: Sequence[int]) -> None:
        for t in new:
            self.tokens.append(int(t))
            i = len(self.tokens) - 1
            for n in range(1, min(self.max_match, i + 1) + 1):
                self.ends[n].setdefault(tuple(self.tokens[i - n + 1 : i + 1]), []).append(i)

    def trim(self, n: int) -> None:
        """Forget every token from position n on (and the n-grams ending there)."""
        for i in range(len(self.tokens) - 1, n - 1, -1):
            for m in range(1, min(self.max_match, i + 1) + 1):
                key = tuple(self.tokens[i - m + 1 : i + 1])
                ends = self.ends[m][key]
                ends.pop()  # i is the last end of its key: later ones went first
                if not ends:
                    del self.ends[m][key]
        del self.tokens[n:]

    def begin(self, seq: Sequence[int]) -> None:
        """Keep the index of the prompt's prefix this lookup already indexed (a conversation's
        earlier turns): it is extended, not rebuilt."""
        self.trim(common_prefix(self.tokens, seq, len(seq)))

    def _sync(self, seq: Sequence[int]) -> None:
        """Index exactly seq: append what is new (the loop only appends between trims)."""
        m = len(self.tokens)
        if m > len(seq) or (m and int(seq[m - 1]) != self.tokens[-1]):
            self.trim(common_prefix(self.tokens, seq, len(seq)))
            m = len(self.tokens)
        self._extend(seq[m:])

    def longest_match(self) -> tuple[int, list[int]]:
        """(n, earlier end positions) of the longest suffix of the text (n <= max_match) that
        occurred before, the latest first; (0, []) when not even its last token did."""
        last = len(self.tokens) - 1
        for n in range(min(self.max_match, last), 0, -1):
            ends = self.ends[n].get(tuple(self.tokens[last - n + 1 :]))
            if ends and len(ends) > 1:
                return n, ends[-2::-1]
        return 0, []

    # --- proposing ------------------------------------------------------------------------------
    def kind(self, n: int) -> str:
        return "weak" if n < self.min_match else "sure" if n >= self.sure_match else "short"

    def propose(self, seq, k):
        """(drafts [<= k], kind): the majority continuation of the longest earlier match while more
        than ``agree`` of the occurrences still consistent with it agree; ([], "") without a match."""
        self._sync(seq)
        n, ends = self.longest_match()
        if n == 0 or k < 1:
            return [], ""
        toks, L = self.tokens, len(self.tokens)
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
        kind = self.kind(n)
        if not out and kind == "weak":
            out, kind = toks[ends[0] + 1 : ends[0] + 1 + k], "latest"
        return out, kind

    def info(self) -> dict:
        return {"drafter": self.name, "min_match": self.min_match, "sure_match": self.sure_match,
                "max_match": self.max_match, "agree": self.agree}
