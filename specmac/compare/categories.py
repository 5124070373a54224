"""compare's table per prompt category: which configuration pays on which part of a workload.

Pooled per (configuration, category): tokens/s as tokens over seconds (the decoding steps; end to
end adds the target's prefill of the prompt), the speedup as that over the same target's plain
decoding of the same prompts and rounds, acceptance and tokens per target pass. The overall line
("all") pools every category, so it is weighted by tokens. Which drafter a hybrid chose is summed
from the runs' ``sources`` counts.

On a shared machine the speed of identical work drifts by more than the margins a benchmark asks
about (runs that drafted nothing differ from plain decoding by tens of percent), so each row also carries the
*normalised* speedup where the runs allow it: each run's tokens per second in units of its own
plain steps (the steps that drafted nothing), which takes the machine's speed at the time of the
run out of the comparison (``normalised_speedup``).
"""

from __future__ import annotations

import numpy as np

from specmac.compare.settings import AUTO, PLAIN
from specmac.core.sources import FREE

ALL = "all"
# a run's own plain steps time the machine where it made at least this many
MIN_PLAIN_STEPS = 8


def normalised_speedup(run: dict, base: dict | None = None) -> float | None:
    """The run's speed over plain decoding's at the machine's speed during the run: its tokens
    times its mean plain step (a step that drafted nothing costs what a plain decoding step costs
    then, and a stall hits every kind of step alike) over its seconds, over what plain decoding
    makes of a pass (``base``, its run of the same prompt: tokens per pass, under 1 where its last
    pass found EOS; 1 without one). Plain decoding's own is 1. None where the run made fewer than
    ``MIN_PLAIN_STEPS`` such steps (a model draft that drafts every step has no clock of its own:
    the paired speedup is all there is) or a record predates them. What it cannot see: a drafter's
    own work on the steps it drafts nothing (its lookup, the planner's choice),
    which slows those steps too (``plain_step_ratio``)."""
    n = run.get("n_plain_steps", 0)
    if not run.get("plain_step_s") or n < MIN_PLAIN_STEPS or not run.get("seconds"):
        return None
    per_pass = base["n_tokens"] / base["n_target_passes"] if base and base.get("n_target_passes") else 1.0
    return run["n_tokens"] * run["plain_step_s"] / run["seconds"] / per_pass


def plain_step_ratio(run: dict, base: dict | None) -> float | None:
    """The run's mean plain step over its plain run's: the machine's drift between the two runs,
    times whatever a drafter's own work adds to a step that drafts nothing (over several rounds
    the drift averages out and the work stays)."""
    if not base or not run.get("plain_step_s") or not base.get("plain_step_s"):
        return None
    return run["plain_step_s"] / base["plain_step_s"]


def by_category(runs: list[dict]) -> list[dict]:
    """Rows per (configuration, category), each category's rows in first-seen order, then "all"."""
    cats = list(dict.fromkeys(r.get("category") or "" for r in runs))
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        for cat in (r.get("category") or "", ALL):
            groups.setdefault((r["config"], cat), []).append(r)
    rows = []
    for cat in [*cats, ALL]:
        for (_config, c), rs in groups.items():
            if c != cat:
                continue
            row = _row(rs, cat)
            # the baseline pooled over the same prompts and rounds as this configuration's runs
            keys = {(r["prompt"], r["round"]) for r in rs}
            same = [r for r in groups.get((f"{PLAIN}:{row['target']}", cat), [])
                    if (r["prompt"], r["round"]) in keys]
            b = _pooled(same) if same else None
            for key in ("tokens_per_second", "end_to_end_tokens_per_second"):
                row[key.replace("tokens_per_second", "speedup")] = (
                    row[key] / b[key] if b and b[key] and row[key] else None)
            by_key = {(r["prompt"], r["round"]): r for r in same}
            norm = [x for r in rs
                    if (x := normalised_speedup(r, by_key.get((r["prompt"], r["round"])))) is not None]
            row["normalised_speedup"] = float(np.median(norm)) if norm else None
            row["n_normalised"] = len(norm)
            # per run over its plain run: one stalled run cannot carry the median, as it can the pool
            paired = [r["tokens_per_second"] / b["tokens_per_second"] for r in rs
                      if (b := by_key.get((r["prompt"], r["round"]))) and r.get("tokens_per_second")
                      and b.get("tokens_per_second")]
            row["median_speedup"] = float(np.median(paired)) if paired else None
            row["speedup_range"] = [min(paired), max(paired)] if paired else None
            rows.append(row)
    return rows


def _pooled(rs: list[dict]) -> dict:
    tokens = sum(r["n_tokens"] for r in rs)
    seconds = sum(r["seconds"] for r in rs)
    e2e = seconds + sum(r.get("t_prefill", 0.0) for r in rs)
    return {"n_tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds if seconds > 0 else None,
            "end_to_end_tokens_per_second": tokens / e2e if e2e > 0 else None}


def _row(rs: list[dict], category: str) -> dict:
    first = rs[0]
    spec = first["draft"] != PLAIN
    drafted, accepted = sum(r["n_drafted"] for r in rs), sum(r["n_accepted"] for r in rs)
    passes = sum(r["n_target_passes"] for r in rs)
    p = _pooled(rs)
    sources: dict[str, int] = {}
    for r in rs:
        for name, n in (r.get("sources") or {}).items():
            sources[name] = sources.get(name, 0) + n
    return {"config": first["config"], "draft": first["draft"], "target": first["target"], "k": first["k"],
            "category": category, "n_runs": len(rs), **p,
            "acceptance_rate": accepted / drafted if spec and drafted else None,
            "tokens_per_target_pass": p["n_tokens"] / passes if spec and passes else None,
            "sources": sources or None}


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "\u2013" if v is None else f"{v:{spec}}{unit}"


def _median_cell(row: dict) -> str:
    lo_hi = row.get("speedup_range")
    if row.get("median_speedup") is None or not lo_hi:
        return "\u2013"
    return f"{row['median_speedup']:.2f}\u00d7 ({lo_hi[0]:.2f}\u2013{lo_hi[1]:.2f})"


def category_markdown(rows: list[dict]) -> list[str]:
    """The per-category section of summary.md (nothing for a record without categories)."""
    if not rows or {r["category"] for r in rows} <= {"", ALL}:
        return []
    out = ["## Per category", "",
           "Pooled over the category's runs; speedup over the same target's plain decoding of the same "
           "prompts and rounds; median run speedup: the median over runs of each run's tokens/s over plain's "
           "run of the same prompt and round (one stalled run cannot carry it), lowest and highest in "
           "brackets; normalised: the median run's tokens/s in units of its own plain steps, so "
           "at the machine's speed while it ran (runs with too few plain steps: \u2013); end to end counts "
           "the target's prefill of the prompt too; **all** pools every category (weighted by tokens).", "",
           "| category | configuration | K | tokens | tokens/s | speedup | median run speedup (range) | "
           "normalised | end-to-end tokens/s | end-to-end speedup | acceptance | tokens/pass | "
           "steps by source |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cat = f"**{r['category']}**" if r["category"] == ALL else r["category"] or "(none)"
        src = ", ".join(f"{k} {v}" for k, v in (r["sources"] or {}).items()) or "\u2013"
        out.append(f"| {cat} | {r['config']} | {r['k'] or '–'} | {r['n_tokens']} | "
                   f"{_fmt(r['tokens_per_second'], '.1f')} | {_fmt(r.get('speedup'), '.2f', '×')} | "
                   f"{_median_cell(r)} | {_fmt(r.get('normalised_speedup'), '.2f', '×')} | "
                   f"{_fmt(r['end_to_end_tokens_per_second'], '.1f')} | "
                   f"{_fmt(r.get('end_to_end_speedup'), '.2f', '×')} | {_fmt(r['acceptance_rate'], '.3f')} | "
                   f"{_fmt(r['tokens_per_target_pass'], '.2f')} | {src} |")
    return out + [""]


# --- the hybrid's budget: each draft at K auto and at its best fixed K, the hybrid against its rivals

MEASURES = (("speedup", "decoding"), ("normalised_speedup", "normalised"),
            ("end_to_end_speedup", "end to end"))


def _budget_groups(rows: list[dict]) -> list[tuple[str, list[str], list[str]]]:
    """(target, its drafts, its categories) for each target measured with a hybrid ("FREE+BACKEND")."""
    out = []
    for target in dict.fromkeys(r["target"] for r in rows if "+" in r["draft"]):
        mine = [r for r in rows if r["target"] == target and r["category"] != ALL]
        drafts = [d for d in dict.fromkeys(r["draft"] for r in mine) if d != PLAIN]
        out.append((target, drafts, list(dict.fromkeys(r["category"] for r in mine))))
    return out


def _rivals(hybrid: str, drafts: list[str]) -> list[str]:
    """What a hybrid must beat besides plain decoding: every model draft and its own free source."""
    return [d for d in drafts if d == hybrid.split("+")[0] or (d not in FREE and "+" not in d)]


def _at(rows: list[dict], target: str, cat: str, draft: str, key: str) -> tuple[dict | None, dict | None]:
    """(the row at K auto, the row at the best fixed K by decoding tokens/s) of one draft; for the
    normalised measure a row without one takes its pooled paired speedup ("paired_only")."""
    here = [r for r in rows if r["target"] == target and r["category"] == cat and r["draft"] == draft]
    if key == "normalised_speedup":
        here = [r if r.get(key) is not None or r.get("speedup") is None
                else r | {key: r["speedup"], "paired_only": True} for r in here]
    auto = next((r for r in here if r["k"] == AUTO), None)
    best = max((r for r in here if r["k"] != AUTO and r.get("speedup")), key=lambda r: r["speedup"],
               default=None)
    return auto, best


def hybrid_checks(rows: list[dict]) -> list[dict]:
    """Per target, measure, category and hybrid: its speedup at K auto over the best of plain
    decoding (1.0), every model draft and its own free source (each at K auto): above 1, the
    hybrid beat every one of them there. ``rows``: ``by_category``'s; "all" is not checked (it pools
    the categories by tokens, and the question is which category the hybrid pays on)."""
    out = []
    for target, drafts, cats in _budget_groups(rows):
        for key, label in MEASURES:
            for cat in cats:
                auto = {d: _at(rows, target, cat, d, key)[0] for d in drafts}
                for h in (d for d in drafts if "+" in d):
                    rivals = {PLAIN: 1.0} | {d: auto[d][key] for d in _rivals(h, drafts)
                                             if auto[d] and auto[d].get(key)}
                    best = max(rivals, key=lambda d: rivals[d])
                    mine = auto[h][key] if auto[h] and auto[h].get(key) else None
                    out.append({"target": target, "category": cat, "measure": label, "hybrid": h,
                                "hybrid_speedup": mine, "rivals": rivals, "best_rival": best,
                                "ratio_to_best": mine / rivals[best] if mine else None})
    return out


def _cell(row: dict | None, key: str) -> str:
    if not row or row.get(key) is None:
        return "\u2013"
    if key == "normalised_speedup":
        return f"{row[key]:.2f}\u00d7" + ("*" if row.get("paired_only") else "")
    return f"{row[key]:.2f}\u00d7 ({row[key.replace('speedup', 'tokens_per_second')]:.1f})"


def budget_markdown(rows: list[dict]) -> list[str]:
    """summary.md's section for a record with categories and a hybrid (else nothing): per category,
    each draft at K auto and at its best fixed K, the hybrid against its rivals (``hybrid_checks``)
    by decoding, normalised and end-to-end speed, and which source the hybrid's steps took."""
    groups = _budget_groups(rows)
    if not groups or {c for _, _, cats in groups for c in cats} <= {""}:
        return []
    checks = {(c["target"], c["measure"], c["category"], c["hybrid"]): c for c in hybrid_checks(rows)}
    out = ["## Per category: K auto, the best fixed K, the hybrid against its rivals", ""]
    for target, drafts, cats in groups:
        where = f", target {target}" if len(groups) > 1 else ""
        for key, label in MEASURES:
            out += _budget_table(rows, checks, target, drafts, cats, key, label, where)
        hybrids = [d for d in drafts if "+" in d]
        out += [f"### Which source the hybrid's steps took (K auto{where})", "",
                "| category | " + " | ".join(hybrids) + " |", "|---|" + "---|" * len(hybrids)]
        for cat in cats:
            steps = [_at(rows, target, cat, h, "speedup")[0] for h in hybrids]
            out.append(f"| {cat or '(none)'} | " + " | ".join(_sources(r) for r in steps) + " |")
        out.append("")
    return out


def _budget_table(rows: list[dict], checks: dict, target: str, drafts: list[str], cats: list[str],
                  key: str, label: str, where: str) -> list[str]:
    hybrids = [d for d in drafts if "+" in d]
    head = ["category", "plain tokens/s"] + [f"{d} {w}" for d in drafts for w in ("auto", "best fixed K")]
    head += [f"{h} auto / best of plain, {', '.join(_rivals(h, drafts))} (auto)" for h in hybrids]
    note = (" (the median run's; * where its runs made too few plain steps to time the machine: the "
            "pooled paired speedup)") if key == "normalised_speedup" else " (tokens/s in brackets)"
    out = [f"### Speedup over plain, {label}{where}{note}", "",
           "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    tps = "end_to_end_tokens_per_second" if key == "end_to_end_speedup" else "tokens_per_second"
    for cat in cats:
        plain = next((r for r in rows if (r["target"], r["category"], r["draft"]) == (target, cat, PLAIN)),
                     None)
        cells = [cat or "(none)", _fmt(plain.get(tps) if plain else None, ".1f")]
        for d in drafts:
            auto, best = _at(rows, target, cat, d, key)
            cells += [_cell(auto, key), f"{_cell(best, key)} K={best['k']}" if best else "\u2013"]
        cells += [_fmt(checks[target, label, cat, h]["ratio_to_best"], ".2f", "\u00d7") for h in hybrids]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _sources(row: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in ((row or {}).get("sources") or {}).items()) or "\u2013"
