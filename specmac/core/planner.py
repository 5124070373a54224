"""The step planner: for every active sequence, which source drafts its next step, and how wide.

Sources only propose (``specmac.core.drafters``); the loop reports each step's outcome once, to
``Planner.observe``. The planner keeps a ``Record`` per sequence (each source's running acceptance,
per kind of proposal and depth, and how much of the text each kind of source wrote) and one
``Costs`` for all of them (``specmac.core.costs``: the target's step over n tokens, each draft
model's pass and its prefill per token).

A step's options, per sequence: a plain step (1 token, no drafts); a free source's proposal cut to
width w (E(w) tokens expected, no draft seconds); a model's K drafts (E(K) tokens, K passes and,
with the chance that all K are accepted, a pass catching it up, plus its prefill of the text it has
not seen, spread over the tokens it can expect to draft for). ``plan`` picks one option per sequence
so that the pass's expected tokens per second, sum E / (T(W) + sum D) over a pass W tokens wide,
is the most: with one sequence it is the exact argmax; with several, each sequence in turn takes its
best option given the others' until none changes. Batching and speculation spend the same width.

E(w) = 1 + sum_{j<=w} S(j), with S(j) the chance that a proposal's first j drafts are accepted: a
survival curve counted per depth as Kaplan and Meier count it (a depth few proposals reached leans
on the one before it, with the prior's weight), not the geometric sum of one rate: a copied stretch
is accepted for a while and then left, so one proposal's drafts are not independent. Counts are
forgotten a little every step, so a change of text is followed and a declined source is tried again
once its record has faded towards its prior. Every proposal a free source made is scored against
what the step committed, chosen or not, so a kind that is never bet on can still earn its way back.
Where nothing pays at the means, a model is tried at an optimistic acceptance within a small
budget of the time decoded (``specmac.core.tries``): by one sequence, or by a whole batch at once.
A sequence's prior is its sources' own, moved by what the planner's sequences done before it showed
(``settle``): a server's requests start from the acceptance, the answers' lengths and the share of
text free sources wrote that its recent requests met, not from constants.

The prefill of a model that has not seen the text is paid back only over the tokens it can expect to
draft for: the tokens the answer has left, at the chance it ends before ``max_tokens`` (an answer
that has run n tokens is taken to run as far again about as often as not: lengths with the heavy
tail S(x) = c / (c + x), c = ``length`` until sequences are done, then the likeliest), times the
share of the text not written by free sources' accepted drafts. So a long prompt with a short answer
is decoded without starting the model, and a code edit the lookup copies does not pay for a model it
would rarely use.

With a fixed K the widths are the user's: a model drafts K, a free source its proposal up to K
where its first draft is as likely accepted as not; with several sources each step still takes the
one with the most tokens per second (or none), on the run's own timings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from specmac.core.costs import K_MAX, K_MODEL, Costs
from specmac.core.drafters import Drafter, common_prefix
from specmac.core.record import LENGTH, MODEL_PRIOR, OPTIMISM, SHARE_PRIOR, Done, Key, Record  # noqa: F401
from specmac.core.tries import Ledger, try_alone, try_together

K_DEFAULT = 4  # drafts per step unless told otherwise
HOLD = 3  # tokens a model with a costly prefill waits beside free sources, so their share is seen
SETTLED_WEIGHT = 16.0  # drafts a model's own prior counts for against the sequences done: a
# rejection in a short request (a greeting) moves the next one's prior a little; steady traffic more

Offer = tuple[int, list[int], str]  # (source index, drafts, kind): a free source's proposal
Choice = tuple[int | None, int]  # (source index or None for a plain step, width)


class Planner:
    """Chooses each step's source and width from the sequences' records and the shared costs.
    ``k``: None chooses widths (``k="auto"``: ``costs`` measured before the run), an integer fixes
    them. ``length``: the scale of the prior on an answer's length; ``decay``: what the records keep
    of their counts from one step to the next."""

    def __init__(self, sources: Sequence[Drafter], costs: Costs | None = None, k: int | None = None,
                 length: float = LENGTH, decay: float = 0.97) -> None:
        self.sources, self.costs, self.k = list(sources), costs or Costs(), k
        self.length, self.decay = float(length), float(decay)
        self.priors = {(s.name, kind): p for s in self.sources for kind, p in s.priors.items()}
        self.done = Done()  # what the sequences done showed
        self.ledger = Ledger()  # the seconds its passes ran and its model steps lost: a batch's tries
        self._free = any(s.backend is None for s in self.sources)  # free sources beside the models
        self.last: Record | None = None  # the latest sequence started (a run's stats read it)
        self.kept: object | None = None  # where the costs were kept (the tuning layer's; never read here)
        self.settled = ""  # what became of them after the run (set by the API)

    @property
    def label(self) -> str:
        return "auto" if self.k is None else "fixed"

    def record(self, max_tokens: int) -> Record:
        """A new sequence's record (it writes at most ``max_tokens``), owned by this planner. Its
        prior share for each (source, kind) is the source's own, moved by what the sequences done
        before it showed (``settle``; a model's own counting for ``SETTLED_WEIGHT`` drafts), at the
        source's weight: requests to a server are alike enough that the last few say more than a
        constant, and a sequence still learns its own text within a few proposals."""
        priors, shown = {}, {}
        for key, (p, w, one_rate) in self.priors.items():
            a, shown[key] = self.done.counts.get(key, (0.0, 0.0))
            own = SETTLED_WEIGHT if one_rate else w
            priors[key] = ((a + p * own) / (shown[key] + own), w, one_rate)
        self.last = Record(max_tokens, self, priors, self.done.length(self.length), self.done.share(),
                           shown)
        return self.last

    def settle(self, record: Record) -> None:
        """A sequence is done: what it showed joins what those before it did (once; ``Done``)."""
        self.done.add(record, self.priors)

    # --- choosing ---------------------------------------------------------------------------------
    def choose(self, record: Record, offers: Sequence[Offer], behind: Mapping[int, int], room: int) -> Choice:
        """One sequence's next step: ``offers``, the free sources' proposals; ``behind``, per model
        source, the tokens it has not processed; ``room``, the most drafts the step may verify."""
        if not self.sources:  # plain decoding
            return (None, 0)
        if self.k is not None and len(self.sources) == 1:  # the user's K and one source: no choice
            if behind:
                return (0, min(self.k, room)) if room else (None, 0)
            fit = [o for o in offers if min(len(o[1]), room, self.k)
                   and record.survival((self.sources[0].name, o[2]), 1)[1] >= 0.5]
            return (0, min(len(fit[0][1]), room, self.k)) if fit else (None, 0)
        return self.plan([(record, offers, behind, room)])[0]

    def plan(self, asks: Sequence[tuple[Record, Sequence[Offer], Mapping[int, int], int]],
             forwards: Callable[[list[int]], list[int]] = lambda ws: [sum(ws)]) -> list[Choice]:
        """Every active sequence's (source, width) for the next pass: the most expected tokens per
        second over the pass (module docstring); each sequence's options its record owner's. With
        several, each in turn takes its best option given the others', from two starts (all plain;
        each at its best alone, which finds what pays only together: a model drafting for all).
        ``forwards``: the forwards the target makes for the sequences' token counts, as tokens
        each (``BaseBackend.forwards``; default one over them all): the pass costs their sum."""
        owners = [ask[0].owner for ask in asks]
        opts = [p._options(*ask) for p, ask in zip(owners, asks)]
        # a model whose backend scores several lanes in one pass drafts for every sequence at once
        # (``pass_streams``): the sequences' drafting passes on it take the longest of them, each
        # priced at what one drafting for that many sequences costs (``Costs.lanes``); the text each
        # sequence's lane has not seen is its own to read (the prefills add up)
        shared = [np.array([s is not None and bool(getattr(p.sources[s].backend, "can_batch", False))
                            for s in o[0]]) for o, p in zip(opts, owners)]
        names = [[None if s is None else p.sources[s].name for s in o[0]] for o, p in zip(opts, owners)]
        n = len(asks) + 1
        scale = {x: [self.costs.lanes(x, m) for m in range(n)] for x in {*sum(names, [])} - {None}}
        scale[None] = [1.0] * n

        def paid(pick: list[int], skip: int = -1) -> tuple[float, dict, dict]:
            alone, most, count = 0.0, {}, {}
            for j, i in enumerate(pick):
                if j == skip:
                    continue
                if shared[j][i]:
                    x = names[j][i]
                    most[x] = max(most.get(x, 0.0), opts[j][3][i] - opts[j][4][i])
                    count[x] = count.get(x, 0) + 1
                    alone += opts[j][4][i]
                else:
                    alone += opts[j][3][i]
            return alone + sum(v * scale[x][count[x]] for x, v in most.items()), most, count

        tt = self.pass_seconds(np.arange(len(opts) * (2 + max(int(o[1].max()) for o in opts)) + 1))

        one = forwards([1, 2]) == [3]  # one forward over unequal widths: a pass costs its sum's

        def seconds(lens: list[int]) -> float:
            return float(tt[sum(lens)]) if one else float(sum(tt[n] for n in forwards(lens)))

        def rest(pick: list[int], r: int) -> tuple[list[int], float]:
            """The other sequences' widths in the pass (drafts and the last token) and tokens expected."""
            return ([1 + int(opts[j][1][i]) for j, i in enumerate(pick) if j != r],
                    sum(opts[j][2][i] for j, i in enumerate(pick) if j != r))

        def ascend(pick: list[int]) -> list[int]:
            for _ in range(3 if len(opts) > 1 else 1):
                moved = False
                for r, (_, w, e, d, pre) in enumerate(opts):
                    others, got = rest(pick, r)
                    base, most, count = paid(pick, r)
                    top = np.array([most.get(x, 0.0) for x in names[r]])
                    was = np.array([scale[x][count.get(x, 0)] for x in names[r]]) * top
                    grown = (np.array([scale[x][count.get(x, 0) + 1] for x in names[r]])
                             * np.maximum(d - pre, top) + pre)
                    cost = base + np.where(shared[r], grown - was, d)
                    if others and one:
                        tw = tt[sum(others) + 1 + w]
                    elif others:
                        t = {x: seconds([*others, 1 + x]) for x in {int(x) for x in w}}
                        tw = np.array([t[int(x)] for x in w])
                    else:  # alone (every step of one stream): one forward over its width
                        tw = tt[1 + w]
                    best = int(np.argmax((got + e) / (tw + cost)))
                    moved |= best != pick[r]
                    pick[r] = best
                if not moved:
                    break
            return pick

        def rate(pick: list[int]) -> float:
            lens = [1 + int(opts[j][1][i]) for j, i in enumerate(pick)]
            return sum(opts[j][2][i] for j, i in enumerate(pick)) / (seconds(lens) + paid(pick)[0])

        pick = ascend([0] * len(opts))
        if len(opts) > 1:  # the second start: each sequence at its best alone
            solo = ascend([int(np.argmax(e / (self.pass_seconds(1 + w) + d))) for _, w, e, d, _ in opts])
            # the third: all on one shared model at one K, the best such (each alone would pick a
            # wider K than pays for all, and no one sequence leaving plain finds what pays together)
            at = [{(x, int(w)): i for i, (x, w, sh) in enumerate(zip(names[j], o[1], shared[j])) if sh}
                  for j, o in enumerate(opts)]
            alike = [[a.get(key, 0) for a in at] for key in {key for a in at for key in a}]
            pick = max([pick, solo, *([ascend(list(max(alike, key=rate)))] if alike else [])], key=rate)
            if self.k is None and all(o[0][i] is None or p.sources[o[0][i]].backend is None
                                      for o, p, i in zip(opts, owners, pick)):
                alike = [a for a in alike if all(a)]  # every sequence on the model
                pick = try_together(self, asks, opts, names, alike, pick, rate, seconds, paid)
        out = [(o[0][i], int(o[1][i])) for o, i in zip(opts, pick)]
        for r, ask in enumerate(asks):  # nothing pays at the means: one sequence a pass tries a model
            owner = ask[0].owner
            if out[r] != (None, 0) or owner.k is not None:
                continue
            # the others as picked: their widths, tokens and drafting seconds
            batch = (*rest(pick, r), paid(pick, r)[0], seconds) if len(asks) > 1 else None
            if (tried := try_alone(owner, *ask, batch=batch)) is not None:
                out[r] = tried
                break
        return out

    def pass_seconds(self, n: np.ndarray | int) -> np.ndarray:
        """Seconds of a pass over n tokens; past the curve, along the mean step of its wider half or,
        if more, of all of it: never nearly free, and one jump (noise, a tile boundary) paid once."""
        c, n = self.costs.curve(), np.asarray(n)
        top = len(c) - 1
        mid = max(top // 2, 1)
        slope = max((c[top] - c[mid]) / max(top - mid, 1), (c[top] - c[1]) / max(top - 1, 1), 0.0)
        return np.where(n <= top, c[np.minimum(n, top)], c[top] + slope * (n - top))

    def _options(self, record: Record, offers: Sequence[Offer], behind: Mapping[int, int],
                 room: int) -> tuple[list[int | None], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(source, width, E, draft seconds, the prefill's share of them) of each option of one
        sequence's step."""
        src: list[int | None] = [None]
        w, e, d, pre = [0], [1.0], [0.0], [0.0]
        fixed = self.k is not None
        cap = min(room, self.k if fixed else self.costs.widest(K_MAX + 1) - 1)
        for i, n_behind in behind.items():
            ks = self.model_widths(record, i, n_behind, room)
            if ks is None:
                continue
            ex, _, passes, share = self.model_step(record, i, n_behind, ks)
            if n_behind > 2 and (self.sources[i].name, "model") not in record.reached:  # not started yet
                self._explain(record, n_behind, ex, passes, share, ks)
            src += [i] * len(ks)
            w += [int(k) for k in ks]
            e += [float(x) for x in ex]
            d += [float(x) for x in passes + share]
            pre += [float(x) for x in share]
        t = self.pass_seconds(np.asarray(w) + 1)
        # a started model that beats a plain step: free sources' guesses no longer compete with it
        started = any(s is not None and behind[s] <= record.n_out and e[j] / (t[j] + d[j]) > 1 / t[0]
                      for j, s in enumerate(src))
        for i, drafts, kind in offers:
            m = min(len(drafts), cap if fixed else self._pooled_cap(record, i, cap))
            key = (self.sources[i].name, kind)
            if m < 1 or (fixed and record.survival(key, 1)[1] < 0.5):  # fixed K: bets more often won
                continue
            if started and kind in self.sources[i].guesses:
                continue
            ex = np.cumsum(record.survival(key, m))
            ws = [m] if fixed else range(1, m + 1)
            src += [i] * len(ws)
            w += list(ws)
            e += [float(ex[x]) for x in ws]
            d += [0.0] * len(ws)
            pre += [0.0] * len(ws)
        if fixed and len(self.sources) == 1 and len(src) > 1:
            src, w, e, d, pre = src[1:], w[1:], e[1:], d[1:], pre[1:]  # one source, a fixed K: no choice
        return src, np.asarray(w), np.asarray(e, float), np.asarray(d, float), np.asarray(pre, float)

    def _pooled_cap(self, record: Record, i: int, cap: int) -> int:
        """The widest a free source may bet under k="auto": the width its pooled record (all its
        kinds as one rate) would bet on this curve. Its kinds' survival says how far a match of
        that kind runs, read from the few proposals that reached so far; just before a copied
        stretch ends it reads near 1 at every depth, and the pooled rate keeps the next bet from
        going as wide as the curve allows."""
        source = self.sources[i]
        kinds = [k for k in source.priors if k not in source.guesses] or list(source.priors)
        ex = np.cumsum(record.pooled([(source.name, k) for k in kinds], cap))
        ws = np.arange(1, cap + 1)
        return int(ws[np.argmax(ex[ws] / self.pass_seconds(ws + 1))]) if cap else 0

    def model_widths(self, record: Record, i: int, n_behind: int, room: int) -> np.ndarray | None:
        """The K a model source may draft this step (a fixed K: that one), or None: it cannot be
        weighed in seconds yet, or it waits beside free sources while its prefill is dear."""
        name, costs = self.sources[i].name, self.costs
        alone = self.k is not None and len(self.sources) == 1  # the user's K, nothing to weigh it against
        top = min(room, self.k) if self.k is not None else min(room, K_MODEL, costs.widest(K_MAX + 1) - 1)
        if top < 1 or not (alone or costs.knows(name)):
            return None
        if self._free and record.n_out < HOLD and n_behind * costs.prefill(name) > HOLD * costs.curve()[1]:
            return None  # the free sources are tried first: a text they copy would not pay the prefill back
        return np.array([top]) if self.k is not None else np.arange(1, top + 1)

    def model_step(self, record: Record, i: int, n_behind: int, ks: np.ndarray):
        """(E(K), P(all K accepted), the draft's passes in seconds, its prefill's share of the step)
        for each K in ``ks`` (ascending) of model source i: K passes and, where all K are accepted,
        a pass catching it up; its prefill of the ``n_behind`` tokens it has not seen, spread over
        the tokens it can expect to draft for (module docstring), E(K) of them a step."""
        name = self.sources[i].name
        s = record.survival((name, "model"), int(ks[-1]))
        ex = np.cumsum(s)[ks]
        passes = (ks + s[ks]) * self.costs.draft(name)
        left = max(record.left() * record.model_share(self._free), 1.0)
        return ex, s[ks], passes, ex * n_behind * self.costs.prefill(name) / left

    def _explain(self, record: Record, n_behind: int, ex, passes, share, ks) -> None:
        """Note why the model is not started where its prefill is what stops it, else no note."""
        t = self.costs.curve()
        free = float(np.max(ex / (passes + t[ks + 1])))
        if free > 1.0 / t[1] >= float(np.max(ex / (passes + t[ks + 1] + share))):
            left = max(record.left() * record.model_share(self._free), 1.0)
            prefill = float(share[0] / ex[0] * left)
            saving = left * t[1] - left / free
            record.note = (f"model draft not started: its prefill of {n_behind} tokens \u2248 "
                           f"{prefill:.2g} s exceeds the best saving over the \u2248{left:.0f} tokens it "
                           f"would draft for \u2248 {saving:.2g} s")
        else:
            record.note = ""

    def extend(self, record: Record, offers: Sequence[Offer], choice: Choice, n_behind: int) -> Offer | None:
        """After a model drafted (``choice``): a free source's continuation of its drafts (``offers``:
        the free sources' proposals after them), verified in the same pass as far as it pays at the
        chance that all the model's drafts are accepted: a copied stretch that the drafts lead into
        is kept further than the model drafts, for the few widths more. Under k="auto" only, and
        never a guess; None where no continuation pays."""
        i, k = choice
        top = self.costs.widest(K_MAX + 1) - 1 - k  # the pass no wider than the costs have seen
        offers = [(j, d[:top], kind) for j, d, kind in offers if kind not in self.sources[j].guesses]
        if self.k is not None or top < 1 or not offers:
            return None
        ex, s, passes, share = (x[0] for x in self.model_step(record, i, n_behind, np.array([k])))
        best, pick = ex / (self.pass_seconds(k + 1) + passes + share), None
        for j, drafts, kind in offers:
            gain = np.cumsum(record.survival((self.sources[j].name, kind), len(drafts)))[1:] - 1.0
            ws = np.arange(1, len(drafts) + 1)
            rate = (ex + s * gain) / (self.pass_seconds(k + 1 + ws) + passes + share)
            if rate.max() > best:
                best, pick = float(rate.max()), (j, drafts[: int(ws[np.argmax(rate)])], kind)
        return pick

    # --- learning ---------------------------------------------------------------------------------
    def observe(self, record: Record, offers: Sequence[Offer], choice: Choice, drafts: Sequence[int],
                committed: Sequence[int], behind: int, t_draft: float, t_step: float,
                ext: Offer | None = None, timed: bool = True, shared: bool = False, n_batch: int = 1) -> None:
        """One step's outcome, reported once by the loop: the free sources' ``offers``, the
        ``choice`` and the ``drafts`` it verified (a model's followed by its extension ``ext``), the
        tokens the step ``committed``, how far the chosen model was ``behind``, and the seconds of
        drafting and of the step's pass and rule; ``timed``: the pass was this sequence's alone;
        ``shared``: the model drafted for other sequences in the same passes (the caller reports
        the costs of a shared pass, and of shared drafting); ``n_batch``: the sequences the pass
        scored."""
        src = choice[0]
        if timed:
            self.costs.observe(len(drafts) + 1, t_step)
        for i, proposal, kind in offers:
            record.learn((self.sources[i].name, kind), proposal, committed)
        accepted = common_prefix(drafts, committed, len(drafts))
        free = src is not None and self.sources[src].backend is None
        if src is not None and not free:
            name, k = self.sources[src].name, choice[1]
            record.note = ""  # started (a try starts it without an option that explains): no note of why not
            record.learn((name, "model"), drafts[:k], committed)
            if ext is not None and accepted >= k:  # the extension was reached: learnt as its kind
                record.learn((self.sources[ext[0]].name, ext[2]), ext[1], committed[k:])
            if behind <= 2 and not shared:  # else the draft time holds a prefill, or others' drafts
                self.costs.observe_draft(name, k + (behind == 2), t_draft)
        record.elapsed += t_draft + t_step
        if self.k is None:  # what model steps lost against plain ones: the sequence's, the planner's
            plain, model = float(self.pass_seconds(n_batch)), src is not None and not free
            if model:  # in a pass of n sequences: the seconds it delayed the pass (a plain one: T(n))
                # less its tokens beyond one, at the pass's price per token (alone: t - len(committed) T(1))
                record.lost += t_draft + t_step - plain - (len(committed) - 1) * plain / n_batch
            self.ledger.add(t_draft + t_step, n_batch, len(committed) if model else None, plain)
        record.advance(len(committed), accepted if free else 0)

    def info(self) -> dict:
        out = {"policy": self.label, "k": self.k, "costs": self.costs.info(), "settled": self.settled}
        if self.last is not None:
            out |= self.last.info()
        return out
