"""advise's predictions: acceptance walked along the reference text as the loop walks it
(``Chains``), the costs of a configuration (``Pricing``), its best K, the reason it does not pay,
and the ranking of configurations within precision groups.

Predictions walk the reference text as the loop does rather than use one acceptance rate: each
step drafts K tokens (an n-gram lookup: as many as it finds, at most K), keeps them while they are
accepted, and the next step starts where it ended, so runs of easy tokens, short lookups and the
end of a run are predicted as the loop meets them. Each target variant's configurations form a
*precision group* with the other backends that run the same weights in the same precision (one
output distribution); speedups are against the fastest plain decoder of that group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specmac.advise.measure import Probe
from specmac.core.costs import draft_passes, expected_tokens, fit_beta, why_not
from specmac.core.rejection import coupled_acceptance
from specmac.core.sampling import SamplingParams
from specmac.errors import SpecmacError


def chances(draft: Probe, target: Probe, params: SamplingParams) -> list[list[list[float]]]:
    """Per text and reference position, the chances that the drafts a step starting there makes
    are each accepted, given the ones before were: a model draft's first, then (teacher forcing:
    an accepted draft is the reference token, or distributed as it) the next position's first; a
    model-free lookup's proposals one by one (greedy: is it the target's argmax; sampled: p(token));
    a hybrid's, the lookup's where it proposes and the model's elsewhere (``model_steps``)."""
    if draft.variant.model_free:
        return [_lookup_chances(q, p, params) for q, p in zip(draft.rows, target.rows)]
    out = []
    for q, p in zip(draft.rows, target.rows):
        if params.greedy:
            a = (q == p).astype(float)
        elif getattr(params, "sampler", "rejection") == "coupled":  # the coupled sampler's race
            a = np.array([coupled_rate(pi, qi) for pi, qi in zip(p, q)])
        else:
            a = np.minimum(p, q).sum(axis=-1)
        out.append([list(a[i:]) for i in range(len(a))])
    if draft.lookup is not None:  # a hybrid: where the lookup proposes, its drafts are the step's
        out = [[lc if prop else mc for prop, lc, mc in zip(props, _lookup_chances(props, p, params), text)]
               for props, p, text in zip(draft.lookup, target.rows, out)]
    return out


def _lookup_chances(proposals: list, p, params: SamplingParams) -> list[list[float]]:
    return [[float(t == p[i + j]) if params.greedy else float(p[i + j][t])
             for j, t in enumerate(prop[: len(p) - i])] for i, prop in enumerate(proposals)]


def model_steps(draft: Probe) -> bool | list[list[bool]]:
    """Which steps the draft model makes: all (a model draft), none (a lookup), or per text and
    position where the lookup has nothing (a hybrid)."""
    if draft.lookup is not None:
        return [[not prop for prop in props] for props in draft.lookup]
    return not draft.variant.model_free


def coupled_rate(p: np.ndarray, q: np.ndarray, top: int = 64) -> float:
    """The coupled sampler's acceptance at one position (``coupled_acceptance``) over the ids that
    carry the mass: the union of p's and q's ``top`` most likely ids (the rest can add at most the
    mass left out, which a full vocabulary's O(V^2) race cannot afford to count)."""
    ids = np.union1d(np.argpartition(p, -top)[-top:], np.argpartition(q, -top)[-top:]) \
        if len(p) > top else np.arange(len(p))
    return coupled_acceptance(p[ids], q[ids])


@dataclass
class Chains:
    """What the loop's steps make as it walks each reference text, per K = 1..k_max: tokens accepted
    per step (accepted drafts + the target's own), draft passes per step (a model draft: K, plus
    the catch-up pass after a step that accepted all K) and the share of steps whose target pass is n
    tokens wide (``width[k - 1][n - 1]``; a model draft: K + 1).

    The walk is the loop's: the first step starts at the text's first position, each next one
    where the last one's accepted tokens end, and no step drafts past the text's last token (the loop
    caps K at the tokens left to write), so the prediction is for a run as long as the reference
    text. A step that starts after a hard token is weighed as often as the loop makes one there:
    averaging over every start position instead overpredicts wide K, since easy runs are crossed in
    one step but counted at each of their positions. Sampled, a step's accepted count is random: the
    walk carries the chance of starting at each position (a reference text stands in for the text
    after a correction)."""

    alpha: float  # mean chance that a first draft is accepted, over every position (0: no lookup)
    tokens: list[float]
    passes: list[float]
    width: list[list[float]]
    # a hybrid: tokens per step its model is fed before it drafts (what lookup steps wrote since)
    catch_up: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, chances: list[list[list[float]]], k_max: int, model: bool | list[list[bool]]) -> Chains:
        """``chances[text][i]``: for a step starting at position i, the chance of each of its
        drafts being accepted given the ones before were (a model draft: one per position to the
        text's end; an n-gram lookup: one per token it found). ``model``: whether the steps are a
        draft model's, for all, or per text and position (a hybrid)."""
        flags = [[model] * len(t) for t in chances] if isinstance(model, bool) else model
        measured_texts = [(t, f) for t, f in zip(chances, flags) if t]
        if not measured_texts:
            raise SpecmacError("no reference position to measure acceptance on: give longer prompts")
        alpha = float(np.mean([c[0] if c else 0.0 for t, _ in measured_texts for c in t]))
        tokens, passes, width, catch_up = [], [], [], []
        for k in range(1, k_max + 1):
            steps = accepted = drafted = full = fed = 0.0
            w = np.zeros(k_max + 1)
            for text, by_model in measured_texts:
                n = len(text)
                mass = np.zeros(n + 1)  # the chance that a step starts at each position
                mass[0] = 1.0
                for i in range(n):
                    m = mass[i]
                    if m == 0.0:
                        continue
                    c = np.asarray(text[i][: min(k, n - i - 1)], float)  # drafts: none past the end
                    run = np.cumprod(c)  # P(the first j drafts all accepted), j = 1..d
                    step_model = by_model[i]
                    d = min(k, n - i - 1) if step_model else len(c)
                    steps += m
                    accepted += m * (1.0 + run.sum())
                    if step_model:
                        drafted += m * d
                        full += m * run[-1] if d == k else 0.0
                    elif not isinstance(model, bool):  # a hybrid's lookup step: its model catches up later
                        fed += m * (1.0 + run.sum())
                    w[d] += m
                    stop = np.concatenate([[1.0], run]) * np.concatenate([1.0 - c, [1.0]])  # P(j accepted)
                    mass[i + 1: i + 2 + len(c)] += m * stop
            tokens.append(accepted / steps)
            passes.append((drafted + full) / steps)
            width.append(list(w / steps))
            catch_up.append(fed / steps if drafted else 0.0)
        return cls(alpha, tokens, passes, width, catch_up)


def acceptance(draft: Probe, target: Probe, params: SamplingParams, k_max: int) -> Chains:
    """The chains of the reference text for this draft in front of this target."""
    return Chains.of(chances(draft, target, params), k_max, model_steps(draft))


def acceptance_by_category(draft: Probe, target: Probe, params: SamplingParams, k_max: int,
                           groups: dict[str, list[int]]) -> tuple[Chains, dict[str, Chains]]:
    """The chains of the whole reference text and of each category's texts (``groups``: category
    -> text indices), from one computation of the chances."""
    ch, steps = chances(draft, target, params), model_steps(draft)
    pick = (lambda ix: steps) if isinstance(steps, bool) else (lambda ix: [steps[i] for i in ix])
    by = {c: Chains.of([ch[i] for i in ix], k_max, pick(ix)) for c, ix in groups.items()}
    return Chains.of(ch, k_max, steps), by


@dataclass
class Pricing:
    """Seconds: a target's step over n tokens (pass + the loop), a draft's pass (+ its sampling),
    and the draft's prefill of the prompt, paid once per run of ``run_tokens`` tokens (0: not
    counted, steady state). The target's prefill is not counted: plain decoding pays it too."""

    step: list[float]  # step[n - 1], n = 1..k_max + 1
    t_draft: float
    t_prefill: float = 0.0
    run_tokens: int = 0
    t_feed: float = 0.0  # a hybrid: seconds per token its model is fed in a batched catch-up pass

    def tps(self, alpha: float | Chains, k: int, steady: bool = False) -> float:
        """Predicted tokens/s at K = k (k = 0: plain decoding) over a run of ``run_tokens`` tokens
        (``steady``: without the draft's prefill): from the reference text's chains, or (a float)
        from one acceptance rate, the same at every position."""
        if k == 0:
            return 1.0 / self.step[0]
        if isinstance(alpha, Chains):
            verify = sum(share * self.step[n] for n, share in enumerate(alpha.width[k - 1]) if share)
            feed = alpha.catch_up[k - 1] * self.t_feed if alpha.catch_up else 0.0
            tps = alpha.tokens[k - 1] / (alpha.passes[k - 1] * self.t_draft + verify + feed)
        else:
            drafting = draft_passes(alpha, k, catch_up=True) * self.t_draft
            tps = expected_tokens(alpha, k) / (drafting + self.step[k])
        if steady or not self.run_tokens or not self.t_prefill or (isinstance(alpha, Chains)
                                                                   and not alpha.passes[k - 1]):
            return tps  # (a hybrid whose model never drafts never prefills)
        return self.run_tokens / (self.t_prefill + self.run_tokens / tps)

    def tokens_to_pay(self, alpha: float | Chains, k: int) -> float | None:
        """The run length from which drafting at K = k beats plain decoding, the draft's prefill
        included (None: not even in steady state)."""
        gain = 1.0 / self.tps(0.0, 0) - 1.0 / self.tps(alpha, k, steady=True)  # seconds per token
        return self.t_prefill / gain if gain > 0 else None


# predicted tokens/s this close to the best K's are a tie: the smallest such K is chosen
K_TIE = 0.02


def best(costs: Pricing, alpha: float | Chains, k_max: int, tie: float = 0.0) -> tuple[int, float]:
    """(K, predicted tokens/s): the best K, or with ``tie`` the smallest K predicted within that
    share of the best. Near the top S(K) is flat, the prediction is not finer than a few percent,
    and where acceptance falls short of the prediction, as on texts other than
    advise's, a narrower K loses less."""
    table = [(k, costs.tps(alpha, k)) for k in range(1, k_max + 1)]
    top = max(t for _, t in table)
    return next((k, t) for k, t in table if t >= top * (1.0 - tie))


# an acceptance above this is a copy of the text, not a draft's guess: where speculation pays only
# from there, advise blames the costs (c, beta), not the acceptance
ALPHA_COPY = 0.99


def alpha_needed(costs: Pricing, k_max: int) -> float | None:
    """The smallest acceptance at which some K beats plain decoding (None: not even at 1)."""
    plain = costs.tps(0.0, 0)
    if best(costs, 1.0, k_max)[1] <= plain:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if best(costs, mid, k_max)[1] > plain else (mid, hi)
    return hi


def why_list(costs: Pricing, chains: Chains, beta: float, k_max: int, k: int) -> list[str]:
    """Why this draft does not pay on this target, in the paper's terms: c, beta, alpha; or, where
    it pays in steady state, the draft's prefill of the prompt against a run this short."""
    plain = costs.tps(0.0, 0)
    if costs.t_prefill and costs.tps(chains, k, steady=True) > plain:
        n = costs.tokens_to_pay(chains, k)
        ms = 1e3 * costs.t_prefill
        shown = f"{ms:.0f}" if ms >= 10 else f"{ms:.2g}"
        return [f"the draft's prefill of the prompt ({shown} ms) outweighs what {costs.run_tokens} "
                f"tokens gain: pays from about {n:.0f} tokens"]
    alpha = chains.alpha
    need = alpha_needed(Pricing(costs.step, costs.t_draft), k_max)
    if need is not None and need > ALPHA_COPY:
        need = None  # only a copy pays: the costs are to blame, not this draft's acceptance
    if need is not None and need <= alpha:  # the walk's runs of accepted drafts are what falls short
        return [f"acceptance too low: \u03b1 = {alpha:.2f}, in runs too short on this text "
                f"(independent acceptances would pay from \u03b1 = {need:.2f})"]
    if need is not None:
        return [f"acceptance too low: \u03b1 = {alpha:.2f} (pays from \u03b1 = {need:.2f})"]
    reasons = why_not(alpha, costs.t_draft, lambda n: costs.step[min(n, len(costs.step)) - 1], beta, k_max,
                      catch_up=True)
    return reasons or [f"draft too slow: c = {costs.t_draft / costs.step[0]:.2f}"]


def why(costs: Pricing, chains: Chains, beta: float, k_max: int, k: int) -> str:
    """``why_list`` as one line."""
    return "; ".join(why_list(costs, chains, beta, k_max, k))


def ranking(targets: list[Probe], drafts: list[Probe], alphas: dict[tuple[int, int], Chains], k_max: int,
            w_row: float, w_draft: float, run_tokens: int = 0,
            by_category: dict[tuple[int, int], dict[str, Chains]] | None = None,
            groups: dict[str, list[int]] | None = None) -> list[dict]:
    """Every configuration at its best K, ranked by predicted tokens/s over a run of ``run_tokens``
    tokens (the draft's prefill of the prompt included; 0: steady state) within precision groups,
    groups in the order of their best configuration. With ``by_category`` (the chains of each
    category's texts, ``groups``: category -> text indices) each entry also holds the prediction
    per category at its K (and the category's own best K)."""
    entries = []
    for ti, t in enumerate(targets):
        step = [x + t.t_step + w_row * n for n, x in enumerate(t.t_pass)]
        n = np.arange(1, len(t.t_pass) + 1)
        _, beta = fit_beta(n, t.t_pass)
        base = Pricing(step, 0.0)
        entries.append(_entry(None, t, 0, base.tps(0.0, 0), None, beta, None))
        if by_category is not None:
            entries[-1]["by_category"] = {c: {"k": 0, "predicted_tokens_per_second": base.tps(0.0, 0),
                                              "alpha": None, "tokens_per_pass": 1.0, "best_k": 0,
                                              "best_k_tokens_per_second": base.tps(0.0, 0)}
                                          for c in (groups or {})}
        for di, d in enumerate(drafts):
            if (di, ti) not in alphas:
                continue
            costs = Pricing(step, d.t_pass[0] + (w_draft if not d.variant.model_free else 0.0),
                          d.t_prefill, run_tokens, d.t_feed)
            # a hybrid starts its model only where that pays: else it is its lookup alone
            options = [(costs, di)] + [(Pricing(step, 0.0), li) for li, a in enumerate(drafts)
                                       if a is d.alone and (li, ti) in alphas]
            (costs, ci), k, tps = max(((o, *best(o[0], alphas[o[1], ti], k_max, K_TIE)) for o in options),
                                      key=lambda x: x[2])
            chains = alphas[ci, ti]
            reason = why(costs, chains, beta, k_max, k) if tps <= base.tps(0.0, 0) else None
            entries.append(_entry(d, t, k, tps, chains.alpha, beta, costs.t_draft / step[0], reason))
            entries[-1]["by_k"] = [costs.tps(chains, j) for j in range(1, k_max + 1)]  # K = 1..k_max
            entries[-1]["tokens_per_pass"] = chains.tokens[k - 1]
            entries[-1]["draft_prefill_ms"] = 1e3 * d.t_prefill
            if d.variant.hybrid:
                entries[-1]["model_started"] = ci == di
                if ci != di and reason is None:
                    reason = entries[-1]["reason"] = "its model does not pay here: it runs as lookup alone"
            if by_category is not None:
                per = []
                for o, i in options:  # a hybrid: per category, whichever of its options is faster
                    per.append(category_predictions(o, by_category[i, ti], drafts[i], groups or {}, k, k_max))
                    if d.variant.hybrid:
                        for c in per[-1].values():
                            c["model_started"] = i == di
                entries[-1]["by_category"] = {c: max((p[c] for p in per),
                                                     key=lambda x: x["predicted_tokens_per_second"])
                                              for c in (groups or {})}
    groups_: dict[str, list[dict]] = {}
    for e in entries:
        groups_.setdefault(e["group"], []).append(e)
    out = []
    for group in sorted(groups_, key=lambda g: -max(e["predicted_tokens_per_second"] for e in groups_[g])):
        # a hybrid that runs as its lookup alone ranks after the lookup it equals
        rows = sorted(groups_[group], key=lambda e: (-e["predicted_tokens_per_second"],
                                                     e.get("model_started") is False))
        plain = max((e for e in rows if e["k"] == 0), key=lambda e: e["predicted_tokens_per_second"])
        for e in rows:
            e["predicted_speedup"] = e["predicted_tokens_per_second"] / plain["predicted_tokens_per_second"]
            e["baseline"] = f"plain {plain['target_label']}"
            for cat in e.get("by_category", {}).values():  # plain decoding costs alike on every text
                for key in ("predicted", "best_k"):
                    cat[f"{key}_speedup"] = (cat[f"{key}_tokens_per_second"]
                                             / plain["predicted_tokens_per_second"])
            if e is not rows[0] and e["reason"] is None:
                e["reason"] = (f"slower than {_name(rows[0])}" if e["k"] else
                               f"plain {e['target_label']} decodes slower than {_name(plain)}"
                               if e is not plain else f"plain decoding; {_name(rows[0])} is faster")
            out.append(e)
    for i, e in enumerate(out, 1):
        e["rank"] = i
    return out


def category_predictions(costs: Pricing, chains: dict[str, Chains], d: Probe, groups: dict[str, list[int]],
                         k: int, k_max: int) -> dict[str, dict]:
    """Per category, the prediction at K = k with that category's chains and its draft's prefill
    of its prompts (the mean of theirs), and the category's own best K."""
    out = {}
    for c, ix in groups.items():
        prefill = float(np.mean([d.prefills[i] for i in ix])) if d.prefills else costs.t_prefill
        mine = Pricing(costs.step, costs.t_draft, prefill, costs.run_tokens, costs.t_feed)
        ch = chains[c]
        best_k, _ = best(mine, ch, k_max, K_TIE)
        out[c] = {"k": k, "predicted_tokens_per_second": mine.tps(ch, k), "alpha": ch.alpha,
                  "tokens_per_pass": ch.tokens[k - 1], "best_k": best_k,
                  "best_k_tokens_per_second": mine.tps(ch, best_k)}
    return out


def _name(e: dict) -> str:
    return (f"{e['draft_label']} \u2192 {e['target_label']} at K = {e['k']}" if e["k"]
            else f"plain {e['target_label']}")


def _entry(d: Probe | None, t: Probe, k: int, tps: float, alpha: float | None, beta: float,
           c: float | None, reason: str | None = None) -> dict:
    tv, dv = t.variant, d.variant if d else None
    return {"group": tv.group, "draft": dv.backend if dv else "none",
            "draft_dtype": dv.precision if dv else None,
            "draft_label": dv.label if dv else "none", "draft_model": dv.model if dv else None,
            "target": tv.backend, "target_dtype": tv.precision, "target_label": tv.label,
            "target_model": tv.model, "k": k, "predicted_tokens_per_second": tps, "alpha": alpha,
            "c": c, "beta": beta, "reason": reason}


