"""A hybrid drafter (``--draft lookup+gguf``, ``ngram+mlx``, ...): prompt lookup or a model, per step.

Each step it asks the lookup (free: no pass; its weak matches too, under ``k="auto"``) for its
draft and, from the costs of each source and its running acceptance, predicts tokens per second of
three choices: the lookup's draft (cut to the width that pays best), the model's draft at the best
K (K passes of the model, then a target pass of K + 1), and no draft (a plain step). It proposes
the best. The model's prefill of what it has not seen (the whole prompt the first time it is asked;
what lookup steps added since) is counted in that choice, spread over the tokens the run has left,
so on a long prompt with a short answer the model is never started unless it pays for it
(``k_choice`` says so), with a fixed K too. Costs come from ``HybridPolicy``
(specmac.core.hybrid_policy): the K policy's measured target curve and draft pass (``k="auto"``:
the lookup's widths out to the widest measured, up to ``K_MAX``; the model's to ``K_MODEL``), or,
with a fixed K, the run's own step times (the target's; until one is timed the model, whose
prefill cannot yet be weighed, is not started) and the model's passes as they are timed; the
model's acceptance from what the target kept of its drafts, forgotten slowly, and the lookup's
from its own bets (how far each kind of its matches was kept, depth by depth). ``source`` names
the choice of the last proposal, so the loop's events (and the run's stats) say how often each
source drafted. Under ``k="auto"`` a model step whose drafts lead into a stretch the text holds is
extended by the lookup's continuation, verified in the same pass as far as it pays
(``_extension``; ``extended`` counts it).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from specmac.core.costs import K_MAX, K_MODEL, model_steps, posterior_moments
from specmac.core.drafters import (
    FACTORIES,
    HYBRID,
    ChainedRows,
    Drafter,
    ModelDrafter,
    OneHotRows,
    _common_prefix,
)
from specmac.core.lookup import LookupDrafter

NONE = "none"


class HybridDrafter(Drafter):
    """Lookup where its match pays, the model where it pays more, nothing where neither does."""

    name = "hybrid"
    # tokens the lookup is tried alone before a model with a costly prefill is started: 3, of 1..4 in
    # bench/replay_drafters.py (1 or 2 start the model on a code edit before the lookup shows it copies,
    # 7.3-7.5x plain against 10.3x on torch bf16; 4 costs summarization 3%, wins multi-turn 4%).
    explore = 3
    # the lookup's kinds of match under min_match: they compete with a plain step, never with a started
    # model that pays (priced against it, they took its steps on torch bf16 on a Xeon with AMX and lost:
    # summarization 1.49x plain, 1.87x without; results/workloads_torch_bf16_xeon_amx_share)
    GUESSES = ("weak", "latest")

    def __init__(self, lookup: LookupDrafter, model: ModelDrafter, name: str = "lookup+model",
                 decay: float = 0.97, prior_alpha: float = 0.5, prior_weight: float = 4.0) -> None:
        self.lookup, self.model, self.label = lookup, model, name
        self.backend = model.backend
        self.model_source = model.backend.name
        self.decay, self.prior = decay, (prior_alpha * prior_weight, prior_weight)
        self.cost: Any = None  # a HybridPolicy gives the costs; without one every width costs alike
        self.reset_run()

    def reset_run(self) -> None:
        self.acc = {"model": list(self.prior)}  # the lookup's acceptance is its own bets' (by depth)
        self.steps = {"lookup": 0, self.model_source: 0, NONE: 0}
        self._source = NONE
        self._pending: list[tuple[int, str, list[int]]] = []
        self.model_started = False
        self.k_choice = ""  # why the model was not started where its prefill is what stopped it
        self.model_prefill_s: float | None = None  # what the model's first proposal paid beyond its passes
        self.t_model: list[float] = []  # seconds per model pass, from proposals with little to catch up
        self.tokens = {"lookup": 0, "other": 0}  # what the run committed after lookup steps and after others
        # (length of the text, whether the lookup drafted it and would have been chosen over a started
        # model too) of the last proposal
        self._last: tuple[int, bool] | None = None
        self._lookup_won = False  # the last choice: the lookup, over the model without its prefill too
        self._model_step: tuple[float, float] | None = None  # the model step chosen: (E(K), seconds less T)
        # model drafts extended by the lookup: steps, tokens proposed past the model's, tokens kept of them
        self.extended = {"steps": 0, "proposed": 0, "kept": 0}
        self._ext_pending: tuple[int, int, list[int]] | None = None  # (len(seq), model drafts, extension)

    @property
    def source(self) -> str:
        return self._source

    def max_k(self, n_seq: int) -> int:
        return self.model.max_k(n_seq)

    def trim(self, n: int) -> None:
        self.lookup.trim(n)
        self.model.trim(n)
        if n == 0:
            self.reset_run()

    # --- acceptance ---------------------------------------------------------------------------
    def alpha(self, key: str) -> float:
        a, n = self.acc[key]
        return a / n

    def _learn(self, seq) -> None:
        """What the target kept of the model's last proposals: accepted drafts, and one rejection if
        the committed text shows one. (The lookup scores its own proposals, every one, in its bets.)"""
        for n0, key, drafts in self._pending:
            got = [int(t) for t in seq[n0 : n0 + len(drafts)]]
            a = _common_prefix(got, drafts, len(drafts))
            rejected = a < len(drafts) and len(seq) > n0 + a
            acc = self.acc[key]
            acc[0] = self.decay * acc[0] + a
            acc[1] = self.decay * acc[1] + a + rejected
        self._pending = []
        if self._ext_pending is not None:
            n0, k, ext = self._ext_pending
            got = [int(t) for t in seq[n0 + k : n0 + k + len(ext)]]
            self.extended["kept"] += _common_prefix(got, ext, len(ext))
            self._ext_pending = None

    def model_steps(self, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(E(K), the draft's seconds) of a model step with K drafts, predicted as the model's own K
        policy predicts them (``specmac.core.costs.model_steps``, as ``AdaptiveK``): E(K) under the
        Beta posterior of the model's acceptance, whose heavier tail than alpha^j at the point
        estimate follows a draft that is kept in runs, and K passes plus the chance of a catch-up."""
        a, n = self.acc["model"]
        return model_steps(a, n, ks, self.t_draft1())

    # --- the choice ---------------------------------------------------------------------------
    def t_draft1(self) -> float:
        if self.t_model:
            return float(np.median(self.t_model[-16:]))
        return self.cost.t_draft1() if self.cost is not None else 0.0

    def model_share(self) -> float:
        """The share of the tokens left the model can expect to draft for, its prefill paid back
        over them: of the text so far, what the lookup's kept drafts did not write (``_count``; a
        prior of one token each way). A code edit's lookup writes most of it; its 1-2-token bets
        are steps the model would have taken (counted as the lookup's, they kept the model off
        torch bf16 summarization and multi-turn chat: results/workloads_torch_bf16_xeon_amx_weak)."""
        return (self.tokens["other"] + 1) / (self.tokens["other"] + self.tokens["lookup"] + 2)

    def _hold(self, behind: int, t1: float) -> bool:
        """Not yet start a model whose prefill costs more than the ``explore`` target steps of
        waiting would: the lookup is tried for the first ``explore`` tokens (they cost what plain
        decoding does), so the share of the text it writes (``model_share``) is seen before the
        prefill is paid for a copying text. A prefill cheaper than that wait is paid at once:
        the wait would cost more than a wasted prefill."""
        if self.model_started or self.cost is None:
            return False
        written = self.tokens["lookup"] + self.tokens["other"]
        return written < self.explore and self.cost.prefill_s(behind) > self.explore * t1

    def _count(self, n_seq: int) -> None:
        """Credit the last step's tokens: a lookup step that won over a started model too
        (``_last``) wrote its kept drafts; the target's own token is the others' (a failed bet,
        credited whole, kept the model off torch bf16 multi-turn chat on the AMD EPYC: 0.95x the
        model alone in bench/replay_drafters.py, 0.99x so)."""
        if self._last is not None:
            n0, lookup_won = self._last
            n = max(n_seq - n0, 0)
            kept = max(n - 1, 0) if lookup_won else 0
            self.tokens["lookup"] += kept
            self.tokens["other"] += n - kept

    def choose(self, behind: int, k: int, n_lookup: int, lookup_kind: str) -> tuple[str, int]:
        """(source, width) with the most predicted tokens per second: ("lookup", m <= n_lookup),
        (model, K <= k) or ("none", 0); ``behind``: the tokens the model has not seen;
        ``lookup_kind``: the lookup's kind of match, as its bets name it (``LookupDrafter.last_kind``)."""
        curve = self.cost.curve() if self.cost is not None else np.ones(K_MAX + 2)
        top = len(curve) - 2
        self._model_step = None
        self._lookup_won = False
        best = (NONE, 0, 1.0 / curve[1])  # plain decoding
        if n_lookup and self.cost is not None:
            n_lookup = min(n_lookup, self.cost.lookup_cap())
        if n_lookup:
            m = np.arange(1, min(n_lookup, top) + 1)
            # the lookup's own survival by depth for this kind of match (specmac.core.bets)
            e = self.lookup.bets.expected(lookup_kind, len(m))[1:]
            rate = e / curve[m + 1]
            i = int(np.argmax(rate))
            if rate[i] > best[2]:
                best = ("lookup", int(m[i]), float(rate[i]))
        # K is chosen under k="auto"; a fixed K is the user's (and waits for a timed step, ``timed``)
        timed = k and (self.cost is None or self.cost.timed())
        if timed:
            adaptive = self.cost is not None and self.cost.adaptive
            ks = np.arange(1, min(k, top, K_MODEL) + 1) if adaptive else np.array([k])
            e, draft = self.model_steps(ks)
            width = curve[np.minimum(ks + 1, top + 1)]
            free = float(np.max(e / (draft + width)))  # the model's rate were its prefill paid
            self._lookup_won = best[0] == "lookup" and best[2] >= free
        else:
            self._lookup_won = best[0] == "lookup"
        if timed and not self._hold(behind, curve[1]):
            # the model's prefill of what it has not seen, spread over the tokens left that the model
            # can expect to draft for (per step: e of them)
            left = self.cost.tokens_left() if self.cost is not None else None
            if left:
                left = max(left * self.model_share(), 1.0)
            prefill = self.cost.prefill_s(behind) if self.cost is not None else 0.0
            share = e * prefill / left if left else 0.0
            rate = e / (draft + width + share)
            i = int(np.argmax(rate))
            guess = best[0] == "lookup" and lookup_kind in self.GUESSES and self.model_started
            if rate[i] > best[2] or (guess and rate[i] > 1.0 / curve[1]):
                best = (self.model_source, int(ks[i]), float(rate[i]))
                self._model_step = (float(e[i]), float(np.broadcast_to(draft + share, rate.shape)[i]))
            elif left and prefill and not self.model_started and not self.k_choice:
                if free > best[2]:
                    saving = left / best[2] - left / free
                    self.k_choice = (f"model draft not explored: its prefill of {behind} tokens \u2248 "
                                     f"{prefill:.2g} s exceeds the best saving over the {left:.0f} tokens it "
                                     f"would draft for \u2248 {saving:.2g} s")
        return best[0], best[1]

    def propose(self, seq, k, params, rng, n_vocab, noise=None):
        self._learn(seq)
        look, q_look = self.lookup.propose(seq, k, params, rng, n_vocab)
        kind = self.lookup.last_kind
        behind = len(seq) - (_common_prefix(self.model.seen, seq, len(seq) - 1) if self.model_started else 0)
        self._count(len(seq))
        source, width = self.choose(behind, k, len(look), kind)
        self._last = (len(seq), source == "lookup" and self._lookup_won)
        self._source = source
        self.steps[source] += 1
        if source == NONE:
            return [], None
        if source == "lookup":
            drafts = look[:width]
            return drafts, (None if q_look is None else OneHotRows(drafts, n_vocab))
        t0 = time.perf_counter()
        drafts, q = self.model.propose(seq, width, params, rng, n_vocab, noise=noise)
        dt = time.perf_counter() - t0
        ext = self._extension(seq, drafts, k) if drafts else []
        if ext:
            self.extended["steps"] += 1
            self.extended["proposed"] += len(ext)
            self._ext_pending = (len(seq), len(drafts), ext)
        if not self.model_started:
            self.model_started = True
            self.model_prefill_s = max(dt - width * self.t_draft1(), 0.0) if self.t_model or self.cost else dt
        elif behind <= 2:
            self.t_model.append(dt / width)
        self._pending.append((len(seq), "model", drafts))
        if ext:
            return [*drafts, *ext], ChainedRows(q, OneHotRows(ext, n_vocab)) if q is not None else None
        return drafts, q

    def _extension(self, seq, drafts: list[int], k: int) -> list[int]:
        """The lookup's continuation of the model's drafts, as far as it pays: where the text with
        the drafts ends in a match of ``min_match`` tokens or more (short or sure, never weak), its
        drafts past the model's are verified in the same target pass, at the width w that maximises
        (E(K) + P(all K kept) E_kind(w)) / (the model step's seconds + T(K + 1 + w)): a copied
        stretch that the model's drafts lead into is kept further than the model would draft, for
        the few widths more (about free on a target whose wide pass costs about one token, torch
        bf16 on a CPU; on llama.cpp's the width is dear and it is rarely bet on). Without costs
        (a fixed K) it extends nothing; the proposal stays within the loop's ``k`` (the tokens
        the run has left, the context's room)."""
        if self.cost is None or self._model_step is None or not self.cost.adaptive:
            return []
        curve = self.cost.curve()
        n_model = len(drafts)
        room = min(len(curve) - 2, k) - n_model
        room = min(room, self.cost.lookup_cap())
        if room < 1:
            return []
        lookup = self.lookup
        last = lookup.last_match, lookup.last_kind
        try:
            more, n = lookup.draft([*seq, *drafts], room)
            kind = lookup.last_kind
        finally:  # the lookup as it was: its last proposal's match, an index of the committed text only
            lookup.last_match, lookup.last_kind = last
            lookup.index.truncate(len(seq))
        if not more or n < lookup.min_match or kind not in ("short", "sure"):
            return []
        e_k, seconds = self._model_step
        a, trials = self.acc["model"]
        all_kept = float(posterior_moments(a, trials - a, n_model)[n_model])
        w = np.arange(0, len(more) + 1)
        # the extension's own drafts kept (E(w) less the target's token, which E(K) holds)
        gain = lookup.bets.expected(kind, len(more)) - 1.0
        rate = (e_k + all_kept * gain) / (seconds + curve[n_model + 1 + w])
        return more[:int(np.argmax(rate))]

    def info(self) -> dict:
        return {**self.model.info(), "drafter": self.label, "lookup": self.lookup.info(),
                "steps_by_source": dict(self.steps), "model_prefill_s": self.model_prefill_s,
                "extended": dict(self.extended),
                "k_choice": self.k_choice,
                "alpha": {"model": self.alpha("model"),
                          **{f"lookup_{k}": a for k, a in self.lookup.bets.info()["bet_alpha"].items()}}}


FACTORIES[HYBRID] = lambda model, name: HybridDrafter(LookupDrafter(), model, name=name)
