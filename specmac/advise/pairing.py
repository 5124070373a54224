"""advise for one loaded pairing: the ranking's engine (``measure``, ``predict``) restricted to it.

The target's T(n) comes from the parallelism probe (its record is part of the answer), the draft's
costs and the acceptance from the same teacher-forcing pass the ranking makes, and the table holds
the prediction for every K = 1..k_max, so compare can put it beside what it measures.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmac.advise.measure import Probe, lookup_rows, probe_draft, probe_target, warp_cost_ms
from specmac.advise.predict import (
    K_TIE,
    Pricing,
    acceptance_by_category,
    best,
    category_predictions,
    chances,
    why_list,
)
from specmac.advise.variants import Variant
from specmac.advise.workload import reference
from specmac.api import Pair
from specmac.compare.prompts import advise_prompts
from specmac.core.costs import K_MODEL
from specmac.core.sampling import SamplingParams
from specmac.errors import BadOption
from specmac.probes import probe_parallelism
from specmac.tuning.timing import Progress, check_context, labelled


def _variant(role: str, backend, name: str = "ngram") -> Variant:
    name = backend.name if backend is not None else name
    return Variant(role, name, getattr(backend, "model_id", None) or None)


def _profile(rows: list[list[list[float]]], k_max: int) -> list[float | None]:
    """Per draft position j, the mean chance it is accepted given the drafts before it were."""
    out = []
    for j in range(k_max):
        seen = [c[j] for text in rows for c in text if len(c) > j]
        out.append(float(np.mean(seen)) if seen else None)
    return out


def advise_pair(pair: Pair, *, params: SamplingParams, prompts: str | Sequence[str | dict] | None = None,
                run_tokens: int = 48, k_max: int = K_MODEL, context: int = 128, repeats: int = 3,
                seed: int = 0, chat: bool | None = False, progress: Progress | None = None) -> dict:
    """Predict tokens per target pass and the speedup over plain decoding for K = 1..k_max of this
    pairing (a model draft, a model-free lookup or the hybrid of lookup and a model), from measured
    costs and teacher-forced acceptance on ``prompts`` (None: ``advise_prompts()``; workload
    prompts: also per category, ``by_category``), for runs of ``run_tokens`` tokens; ``chat`` as
    in ``specmac.advise.workload.reference``; ``progress`` hears how far each measurement is.

    Returns best_k, predicted_speedup, alpha, alpha_profile, c, beta, verdict, t_draft_ms,
    t_target_ms, table (per K: k, tokens_per_pass, step_ms, predicted_speedup), reasons (why
    speculation will not pay; empty when it will), the reference text's size and the probe record.
    """
    models = [s.backend for s in pair.sources if s.backend is not None]
    draft, hybrid = (models[0] if models else None), len(pair.sources) > 1
    if not pair.speculative or len(models) > 1:
        raise BadOption("advise needs a draft: a model, a lookup (ngram, lookup) or both (lookup+BACKEND)",
                        param="draft")
    if prompts is None:
        prompts = advise_prompts()
    elif isinstance(prompts, str):
        prompts = [prompts]
    if not prompts:
        raise BadOption("prompts is empty: advise needs at least one prompt to measure acceptance on",
                        param="prompts")
    target = pair.target
    check_context(target, context, k_max + 1)  # refused before anything is measured, never clamped
    if draft is not None:
        check_context(draft, context, 1)
    ref = reference(target, list(prompts), params, run_tokens, seed, chat, labelled(progress, "target: "))
    texts, starts, groups = ref.texts, ref.starts, ref.groups()
    probe = probe_parallelism(target, n_max=k_max + 1, context=context, repeats=repeats)
    n_vocab = target.vocab.size
    tp = probe_target(_variant("target", target), target, k_max, params, texts, starts, n_vocab,
                      t_pass=[ms / 1e3 for ms in probe["batched_ms"]],
                      progress=labelled(progress, "target: "))
    dv = _variant("draft", draft, pair.sources[-1].name)
    dp: Probe = probe_draft(dv, draft, params, texts, starts, n_vocab, k_max, labelled(progress, "draft: "))
    if hybrid:
        dp.variant = Variant("draft", f"lookup+{draft.name}", dp.variant.model)
        dp.lookup = lookup_rows("lookup", texts, starts, params, n_vocab, k_max)
    rows = chances(dp, tp, params)
    chains, by_cat = acceptance_by_category(dp, tp, params, k_max, groups)
    width = target.vocab.n_logits or n_vocab
    w1, wn = (warp_cost_ms(width, n_vocab, params, n) / 1e3 for n in (1, k_max + 1))
    w_row = max(wn - w1, 0.0) / k_max
    step = [x + tp.t_step + w_row * n for n, x in enumerate(tp.t_pass)]
    w_draft = 0.0 if params.greedy or draft is None else w1
    costs = Pricing(step, dp.t_pass[0] + w_draft, dp.t_prefill, run_tokens, dp.t_feed)
    plain = costs.tps(0.0, 0)
    k, tps = best(costs, chains, k_max, K_TIE)
    started, used = None, dp
    if hybrid:  # the hybrid starts its model only where that pays: else it is its lookup alone
        alone = Probe(Variant("draft", "lookup", None, {}, "lookup", "prompt"), [0.0], rows=dp.lookup)
        a_chains, a_cat = acceptance_by_category(alone, tp, params, k_max, groups)
        a_costs = Pricing(step, 0.0)
        a_k, a_tps = best(a_costs, a_chains, k_max, K_TIE)
        started = a_tps <= tps
        if not started:
            costs, chains, by_cat, used, k, tps = a_costs, a_chains, a_cat, alone, a_k, a_tps
    table = [{"k": j, "tokens_per_pass": chains.tokens[j - 1],
              "step_ms": 1e3 * chains.tokens[j - 1] / costs.tps(chains, j),
              "predicted_speedup": costs.tps(chains, j) / plain} for j in range(1, k_max + 1)]
    reasons = why_list(costs, chains, probe["beta"], k_max, k) if tps <= plain else []
    n_ref = sum(len(t) - s for t, s in zip(texts, starts))
    return {
        "model_started": started,
        "best_k": k, "predicted_speedup": tps / plain, "alpha": chains.alpha,
        "alpha_profile": _profile(rows, k_max), "c": costs.t_draft / step[0],
        "beta": probe["beta"], "verdict": probe["verdict"],
        "t_draft_ms": 1e3 * costs.t_draft, "t_draft_pass_ms": 1e3 * dp.t_pass[0] if draft else None,
        "t_target_ms": probe["batched_ms"][0], "target_only_ms_per_token": 1e3 * step[0],
        "draft_prefill_ms": 1e3 * dp.t_prefill,
        "target_curve_ms": probe["batched_ms"],
        "loop_overhead_ms": [1e3 * (s - t) for s, t in zip(step, tp.t_pass)],
        "table": table, "reasons": reasons, "reference": ref.info(),
        "by_category": _by_category(costs, by_cat, used, groups, k, k_max, plain),
        # acceptance is teacher-forced on the target's own continuation of each prompt
        "acceptance_run": {"k": None, "prompts": len(texts), "n_tokens": n_ref,
                           "n_drafted": sum(len(r) for r in rows),
                           "n_accepted": float(sum(c[0] for r in rows for c in r if c)),
                           "per_position_acceptance": _profile(rows, k_max)},
        "target_only_run": {"ms_per_token": 1e3 * step[0]},
        "probe": probe,
        **pair.info(),
    }



def _by_category(costs: Pricing, by_cat: dict, dp: Probe, groups: dict[str, list[int]], k: int, k_max: int,
                 plain: float) -> dict[str, dict]:
    """Per category at the best K overall (and the category's own best K): tokens/s, speedup over
    plain decoding, acceptance and tokens per target pass."""
    out = category_predictions(costs, by_cat, dp, groups, k, k_max)
    for c in out.values():
        c["predicted_speedup"] = c["predicted_tokens_per_second"] / plain
        c["best_k_speedup"] = c["best_k_tokens_per_second"] / plain
    return out
