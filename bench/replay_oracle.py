"""How far any choice of draft could go on the recorded texts: a bound, beside what specmac's drafters do.

    python bench/replay_oracle.py        # results/replay/oracle.md, oracle.json
    python bench/replay_oracle.py --step-costs "torch bf16=results/step_costs/torch_bf16_summ_hybrid" \
        --name oracle_run_costs              # results/replay/oracle_run_costs.md: at a run's step costs

Over the greedy texts ``bench/replay_drafters.py record`` wrote, on the same T(n) curves and draft
costs as its replay, a dynamic programme finds the fastest way through each text for a drafter
that knows in hindsight how far every proposal will be kept, and bets exactly that far:

- **lookup**: at every position, any of the lookup's candidate continuations (its longest earlier
  match, ``LookupDrafter.candidates``, up to ``K_MAX``) at any width, or a plain step;
- **model**: any K up to ``K_MODEL`` of the 0.5B draft's greedy drafts (K passes of it, then a
  pass of K + 1), or a plain step; the draft's prefill of the prompt paid once;
- **both**: either, step by step (the prefill paid where the model is used at all).

It is a bound, not a prediction: it sees the future, and leaves out the draft's catching up after
lookup steps, the loop's own work and the machine's noise. Where the bound is below a budget, no K
policy over these drafters can meet it on these texts and curves. ``replayed``: the drafter specmac
runs (``bench/replay_drafters.py replay``, K auto), for how near it comes.

``--step-costs TARGET=DIR`` prices that target's steps as a run paid them instead
(``bench/step_costs.py``'s record: its median step per width where the run timed a width twice or
more, else its probe's curve times the median ratio of those widths to it), and computes that
target alone. The probe's curve is timed at a short context; a run's steps at a long prompt cost
more the wider they are.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
from replay_drafters import OUT, TARGETS, Clock, load_targets, replay

import specmac.core.hybrid as hybrid_module
from specmac.compare.results import provenance, write_json
from specmac.core.bets import common_prefix
from specmac.core.costs import K_MAX, K_MODEL
from specmac.core.lookup import LookupDrafter

PREFILL_S = 5e-3  # the draft's prefill per token, as bench/replay_drafters.py's default


def kept_runs(text: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per position of the output: how many tokens from there the best lookup candidate would have
    kept (at most K_MAX), and how many the model's greedy drafts would (at most K_MODEL)."""
    prompt, out, guess = text["prompt"], text["output"], text["draft_guess"]
    n = len(out)
    lookup, model = np.zeros(n, int), np.zeros(n, int)
    index = LookupDrafter()
    index.trim(0)
    for pos in range(n):
        room = n - pos - 1
        _, cands = index.candidates(prompt + out[:pos], min(K_MAX, room)) if room else (0, [])
        lookup[pos] = max((common_prefix(out[pos:], cont, len(cont)) for cont, _ in cands), default=0)
        model[pos] = common_prefix(guess[pos:], out[pos:], min(K_MODEL, room))
    return lookup, model


def fastest(n: int, curve: np.ndarray, t_draft: float, lookup: np.ndarray | None,
            model: np.ndarray | None) -> float:
    """Seconds of the fastest way through n tokens: dp[pos] = min over the steps from pos. Where a
    proposal would be kept a tokens, a step keeps w < a drafts at the cost of a bet of w, and all a
    at the cheapest bet of a or wider (the curve is no line: a wider pass can cost less,
    results/probes_wide; on torch bf16 T(2) < T(1)); a model step pays its K passes too."""
    top = min(K_MAX, len(curve) - 2)
    look = curve[np.arange(top + 1) + 1]  # look[w]: a bet of w drafts
    ks = np.arange(K_MODEL + 1)
    mod = ks * t_draft + curve[ks + 1]  # mod[k]: k drafts of the model, then their pass
    sources = [(runs, cost, np.minimum.accumulate(cost[::-1])[::-1])  # cheapest bet of w or wider
               for runs, cost in ((lookup, look), (model, mod)) if runs is not None]
    dp = np.zeros(n + 1)
    for pos in range(n - 1, -1, -1):
        best = curve[1] + dp[pos + 1]
        for runs, cost, wide in sources:
            run = int(runs[pos])
            if not run:  # its first draft rejected (or none): the cheapest pass of any width keeps none
                best = min(best, wide[0] + dp[pos + 1])
            else:
                w = np.arange(1, run + 1)
                step = np.where(w == run, wide[w], cost[w])
                best = min(best, float(np.min(step + dp[pos + w + 1])))
        dp[pos] = best
    return float(dp[0])


def run_curve(record: dict) -> np.ndarray:
    """[n] seconds per step over n tokens (index 0 a copy of 1) as a bench/step_costs.py run paid
    them: its median where it timed the width twice or more, else its probe's times their ratio."""
    probe = np.asarray(record["probe_curve_s"], float)  # index n: width n (0 unused)
    timed = {r["width"]: r["median_s"] for r in record["rows"] if r["steps"] >= 2}
    if 1 not in timed:
        raise SystemExit("the step-costs record has too few one-token steps: run it with --plain")
    ratio = float(np.median([t / probe[n] for n, t in timed.items() if n >= 2] or [timed[1] / probe[1]]))
    curve = np.array([timed.get(n, probe[n] * ratio) for n in range(len(probe))])
    curve[0] = curve[1]
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-costs", action="append", default=[], metavar="TARGET=DIR",
                    help="price TARGET's steps as bench/step_costs.py's record in DIR paid them")
    ap.add_argument("--name", default="oracle", help="the files to write under results/replay")
    args = ap.parse_args()
    priced = {t: run_curve(json.loads((Path(d) / "results.json").read_text()))
              for t, d in (o.split("=", 1) for o in args.step_costs)}
    hybrid_module.time = Clock
    rows = []
    for target, _, texts, curve, share in load_targets(OUT):
        if priced and target not in priced:
            continue
        curve = priced.get(target, curve)
        t_draft = share * curve[1]
        for text in texts:
            lookup, model = kept_runs(text)
            n, plain = len(text["output"]), len(text["output"]) * curve[1]
            prefill = len(text["prompt"]) * PREFILL_S
            bound = {"lookup": fastest(n, curve, t_draft, lookup, None),
                     "model": min(plain, fastest(n, curve, t_draft, None, model) + prefill)}
            bound["both"] = min(bound["lookup"], fastest(n, curve, t_draft, lookup, model) + prefill)
            replayed = {d: replay(d, text, curve, t_draft, PREFILL_S)[0]
                        for d in ("lookup", "model", "hybrid")}
            rows.append({"target": target, "id": text["id"], "category": text["category"],
                         "bound": {k: plain / v for k, v in bound.items()}, "replayed": replayed})
            print(target, text["id"], {k: round(plain / v, 2) for k, v in bound.items()}, file=sys.stderr)
    command = "python bench/replay_oracle.py " + " ".join(sys.argv[1:])
    write_json(OUT / f"{args.name}.json", {"format": "specmac.bench.replay_oracle/1",
                                     "provenance": provenance(command), "prefill_s_per_token": PREFILL_S,
                                     "step_costs": {t: c.tolist() for t, c in priced.items()}, "rows": rows})
    lines = ["# The fastest any choice of draft could go on the recorded texts (a bound)", "",
             f"`{command}` (texts: `python bench/replay_drafters.py record`; method: the script's docstring)",
             "", "Mean over each category's texts of the speedup over plain decoding: the bound for a "
             "drafter that knows how far each proposal will be kept (lookup, model, both), and specmac's "
             "drafters replayed with K auto.", ""]
    for target in (priced or TARGETS):
        lines += [f"## {target}", "", "| category | bound: lookup | bound: model | bound: both | "
                  "replayed: lookup | replayed: model | replayed: hybrid |", "|---|" + "---:|" * 6]
        by_cat = collections.defaultdict(list)
        for r in rows:
            if r["target"] == target:
                by_cat[r["category"]].append(r)
        for cat, rs in by_cat.items():
            b = [np.mean([r["bound"][k] for r in rs]) for k in ("lookup", "model", "both")]
            p = [np.mean([r["replayed"][k] for r in rs]) for k in ("lookup", "model", "hybrid")]
            lines.append(f"| {cat} | " + " | ".join(f"{v:.2f}\u00d7" for v in [*b, *p]) + " |")
        lines.append("")
    (OUT / f"{args.name}.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
