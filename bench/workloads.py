"""Which draft pays on which part of a workload: each category x (plain, model draft, n-gram, lookup, hybrid).

    SPECMAC_CACHE=$(mktemp -d) python bench/workloads.py [--models-dir DIR] \
        --per-category 1 --max-tokens 40 --repeats 2 --out results/workloads

The packaged workload (specmac/data/workload.jsonl, whole conversations) through the target's chat
template, on the Qwen2.5-Coder 1.5B Q4_K_M GGUF target (or another of the same weights:
``--target-backend``, ``--target-model``, ``--target-opt``) with the 0.5B Q4_K_M draft (or
``--draft-model``, a GGUF file with the target's vocabulary), greedy, every
configuration at ``--k`` (default auto) interleaved per prompt and round by compare's measurement
(``specmac.compare.measure``: one warm-up round discarded). Writes results.json (the runs, the
per-configuration and per-category aggregates, greedy identity with plain per prompt), a PNG of the
speedups per category and README.md's tables, each speedup paired (over plain's run of the same
prompt and round) and normalised where a run made enough plain steps to time the machine while it
ran (``specmac.compare.categories.normalised_speedup``: the machine's drift between runs is larger
than the margins the budget asks about). Run it with a fresh SPECMAC_CACHE: `--k auto` keeps the
pass costs it probes, and a probe stalled by a busy machine would be kept for every later run.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from lib.machine import take_machine
from lib.models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.compare.categories import (
    ALL,
    by_category,
    category_markdown,
    normalised_speedup,
    plain_step_ratio,
)
from specmac.compare.measure import PLAIN, Settings, aggregate, load_models, measure, parse_ks, parse_pairs
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.compare.results import provenance, pyplot, save_figure, write_json
from specmac.compare.settings import AUTO, Config
from specmac.core.sampling import SamplingParams

DRAFTS = ["gguf", "ngram", "lookup", "lookup+gguf"]
EDIT = "code_editing"
LOOKUP_LIKE = ("ngram", "lookup")  # drafts without a model; the rest are model drafts or hybrids


@dataclass
class WorkloadSettings(Settings):
    """compare's settings with a K list per draft (``--k-for``): a model draft's best K is not a
    lookup's, and every K measured costs a run of every prompt."""

    ks_for: dict[str, list] = field(default_factory=dict)

    def configs(self) -> list[Config]:
        out = []
        for target in dict.fromkeys(p.target for p in self.pairs):
            out.append(Config(PLAIN, target, 0))
            out += [Config(p.draft, target, k) for p in self.pairs if p.target == target
                    for k in self.ks_for.get(p.draft, self.ks)]
        return out

    def to_dict(self) -> dict:
        return super().to_dict() | {"k_for": self.ks_for,
                                    "max_tokens_per_prompt": {p["id"]: p.get("max_tokens", self.max_tokens)
                                                              for p in self.prompts}}


def pick(prompts: list[dict], per_category: int) -> list[dict]:
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        if seen.get(p["category"], 0) < per_category:
            seen[p["category"]] = seen.get(p["category"], 0) + 1
            out.append(p)
    return out


def identity(runs: list[dict]) -> list[dict]:
    """Per configuration and prompt: did every round's greedy output equal plain decoding's?"""
    plain = {(r["prompt"], r["round"]): r["output_sha1"] for r in runs if r["draft"] == PLAIN}
    out: dict[tuple, dict] = {}
    for r in runs:
        if r["draft"] == PLAIN:
            continue
        row = out.setdefault((r["config"], r["prompt"]), {"config": r["config"], "prompt": r["prompt"],
                                                          "category": r["category"], "same": True})
        row["same"] &= r["output_sha1"] == plain.get((r["prompt"], r["round"]))
    return list(out.values())


def medians(runs: list[dict]) -> list[str]:
    """Per category and configuration: the median over runs of tokens/s over plain decoding's of the
    same prompt and round (one stalled run cannot carry a category, as it can in a pooled ratio),
    of the normalised speedup (each run timed by its own plain steps, where it made enough), and
    of the run's mean plain step over plain's (the machine's drift, and any work a drafter adds to a
    step that drafts nothing)."""
    plain = {(r["prompt"], r["round"]): r for r in runs if r["draft"] == PLAIN}
    cells: dict[tuple, list[tuple[float, float, float, float]]] = {}
    for r in runs:
        b = plain.get((r["prompt"], r["round"]))
        if r["draft"] != PLAIN and b and r["tokens_per_second"] and b["tokens_per_second"]:
            e2e, be2e = (x["n_tokens"] / (x["seconds"] + x["t_prefill"]) for x in (r, b))
            norm, drift = normalised_speedup(r, b), plain_step_ratio(r, b)
            for cat in (r["category"], ALL):
                ratio = r["tokens_per_second"] / b["tokens_per_second"]
                cells.setdefault((cat, r["config"]), []).append(
                    (ratio, e2e / be2e, np.nan if norm is None else norm, np.nan if drift is None else drift))
    out = ["| category | configuration | runs | median speedup | range | median normalised (runs) | range | "
           "plain step / plain's | median end-to-end speedup |", "|---|---|---:|---:|---|---:|---|---:|---:|"]
    for (cat, config), v in sorted(cells.items(), key=lambda kv: (kv[0][0] == ALL, kv[0][0])):
        s, e, n, d = np.array(v).T
        n, d = n[~np.isnan(n)], d[~np.isnan(d)]
        normed = (f"{np.median(n):.2f}\u00d7 ({len(n)}) | {n.min():.2f}\u2013{n.max():.2f}" if len(n)
                  else "\u2013 | \u2013")
        drift = f"{np.median(d):.2f}" if len(d) else "\u2013"
        out.append(f"| {cat} | {config} | {len(v)} | {np.median(s):.2f}\u00d7 | "
                   f"{s.min():.2f}\u2013{s.max():.2f} | {normed} | {drift} | {np.median(e):.2f}\u00d7 |")
    return out + [""]


def _cell(row: dict | None, key: str) -> str:
    if not row or row.get(key) is None:
        return "\u2013"
    if key == "normalised_speedup":
        return f"{row[key]:.2f}\u00d7" + ("*" if row.get("paired_only") else "")
    return f"{row[key]:.2f}\u00d7 ({row[key.replace('speedup', 'tokens_per_second')]:.1f})"


def _normalised(row: dict) -> dict:
    """A category row whose normalised speedup falls back to the pooled paired one (``paired_only``)
    where its runs made too few plain steps (a model draft drafting every step)."""
    if row.get("normalised_speedup") is not None or row.get("speedup") is None:
        return row
    return row | {"normalised_speedup": row["speedup"], "paired_only": True}


def budget(cats: list[dict], drafts: list[str]) -> tuple[list[str], list[dict]]:
    """Per category: each draft with K auto and at its best fixed K (by decoding tokens/s), the
    hybrid against the best of plain, the model draft and the lookup (both K auto), and which source
    the hybrid's steps took. Decoding and end to end (the target's prefill of the prompt counted)."""
    out, checks = [], []
    categories = [c for c in dict.fromkeys(r["category"] for r in cats) if c != ALL]
    hybrids = [d for d in drafts if "+" in d]
    models = [d for d in drafts if d not in LOOKUP_LIKE and "+" not in d]
    for key, label in (("speedup", "decoding"), ("normalised_speedup", "normalised"),
                       ("end_to_end_speedup", "end to end")):
        head = ["category", "plain tokens/s"]
        for d in drafts:
            head += [f"{d} auto", f"{d} best fixed K"]
        head += [f"{h} auto / best of plain, {', '.join(models + ['lookup'])} (auto)" for h in hybrids]
        note = {"normalised": " (the median run's; * where its runs made too few plain steps to time the "
                              "machine: the pooled paired speedup)"}.get(label, " (tokens/s in brackets)")
        out += [f"### Speedup over plain, {label}{note}", "",
                "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for cat in categories:
            here = [r for r in cats if r["category"] == cat]
            plain = next((r for r in here if r["draft"] == PLAIN), None)
            tps = key.replace("normalised_", "").replace("speedup", "tokens_per_second")
            cells = [cat, f"{plain[tps]:.1f}" if plain and plain.get(tps) else "\u2013"]
            auto = {}
            for d in drafts:
                rows = [_normalised(r) if key == "normalised_speedup" else r for r in here if r["draft"] == d]
                a = next((r for r in rows if r["k"] == AUTO), None)
                fixed = [r for r in rows if r["k"] != AUTO and r.get("speedup")]
                best = max(fixed, key=lambda r: r["speedup"], default=None)
                auto[d] = a
                cells += [_cell(a, key), (_cell(best, key) + f" K={best['k']}") if best else "\u2013"]
            for h in hybrids:
                rivals = [1.0] + [auto[d][key] for d in [*models, "lookup"]
                                  if auto.get(d) and auto[d].get(key)]
                mine = auto[h][key] if auto.get(h) and auto[h].get(key) else None
                ratio = mine / max(rivals) if mine else None
                cells.append(f"{ratio:.2f}\u00d7" if ratio else "\u2013")
                checks.append({"category": cat, "measure": label, "hybrid": h, "ratio_to_best": ratio,
                               "hybrid_speedup": mine, "best_rival_speedup": max(rivals),
                               "lookup_speedup": auto["lookup"][key] if auto.get("lookup") else None})
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out += ["### Which source the hybrid's steps took (K auto)", "",
            "| category | " + " | ".join(hybrids) + " |", "|---|" + "---|" * len(hybrids)]
    for cat in categories:
        row = [next((r for r in cats if r["category"] == cat and r["draft"] == h and r["k"] == AUTO), None)
               for h in hybrids]
        out.append(f"| {cat} | " + " | ".join(", ".join(f"{k} {v}" for k, v in (r["sources"] or {}).items())
                                              if r else "\u2013" for r in row) + " |")
    return out + [""], checks


def figure(cats: list[dict], title: str):
    plt = pyplot()
    categories = list(dict.fromkeys(r["category"] for r in cats))
    configs = [c for c in dict.fromkeys(r["config"] for r in cats) if not c.startswith(PLAIN)]
    fig, ax = plt.subplots(figsize=(10, 4.6))
    width = 0.8 / max(len(configs), 1)
    for j, c in enumerate(configs):
        ys = [next((r.get("end_to_end_speedup") or 0 for r in cats
                    if r["config"] == c and r["category"] == k), 0) for k in categories]
        ax.bar([i + j * width for i in range(len(categories))], ys, width, label=c)
    ax.axhline(1.0, color="k", ls="--", lw=1, label="plain = 1.0")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(categories))], categories, rotation=20, fontsize=8)
    ax.set_ylabel("end-to-end speedup over plain (pooled)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=3)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--per-category", type=int, default=1, help="prompts per category")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", default="auto", help="K values as compare takes them (default auto)")
    ap.add_argument("--out", type=Path, default=Path("results/workloads"))
    ap.add_argument("--target-backend", default="gguf", choices=["gguf", "torch"])
    ap.add_argument("--target-model", help=f"the target's file or folder [default: MODELS_DIR/"
                                           f"{QWEN_15B_GGUF}]")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="a target backend option, e.g. dtype=bfloat16 (repeatable)")
    ap.add_argument("--draft-model", help=f"the model draft's GGUF file [default: MODELS_DIR/"
                                          f"{QWEN_05B_GGUF}]")
    ap.add_argument("--categories", default="", help="comma-separated categories (default: every one)")
    ap.add_argument("--drafts", default=",".join(DRAFTS), help="drafts, comma-separated (default: all)")
    ap.add_argument("--k-for", action="append", default=[], metavar="DRAFT=KS",
                    help="the K values of one draft (as --k takes them), e.g. gguf=auto,4 (repeatable)")
    ap.add_argument("--edit-tokens", type=int, default=256,
                    help="new tokens for the code-editing prompts (a rewritten file is long; default 256)")
    args = ap.parse_args()
    target = args.target_model or str(args.models_dir / QWEN_15B_GGUF)
    draft = args.draft_model or str(args.models_dir / QWEN_05B_GGUF)
    tb = args.target_backend
    prompts = read_prompts(PACKAGED_WORKLOAD, turns="all")
    wanted = [c for c in args.categories.split(",") if c]
    unknown = sorted(set(wanted) - {p["category"] for p in prompts})
    if unknown:
        ap.error(f"--categories: no prompts of {', '.join(unknown)} in the packaged workload")
    prompts = pick([p for p in prompts if not wanted or p["category"] in wanted], args.per_category)
    prompts = [p | {"max_tokens": args.edit_tokens} if p["category"] == EDIT else p for p in prompts]
    drafts = [d for d in args.drafts.split(",") if d]
    ks_for = {}
    for kv in args.k_for:
        d, sep, ks = kv.partition("=")
        if not sep or d not in drafts:
            ap.error(f"--k-for {kv!r}: write DRAFT=KS with DRAFT one of {', '.join(drafts)}")
        ks_for[d] = parse_ks(ks)
    topts = dict(kv.split("=", 1) for kv in args.target_opt)
    backends = {tb: {"target_model": target, "target_options": topts}}
    backends.setdefault("gguf", {})["draft_model"] = draft
    settings = WorkloadSettings(ks_for=ks_for, pairs=parse_pairs([f"{d}:{tb}" for d in drafts]),
                                ks=parse_ks(args.k), prompts=prompts,
                        params=SamplingParams(0.0), max_tokens=args.max_tokens, repeats=args.repeats,
                        warmup_tokens=4, chat=True, backends=backends)
    command = "SPECMAC_CACHE=$(mktemp -d) python bench/workloads.py " + shlex.join(sys.argv[1:])
    take_machine(command)
    loaded = load_models(settings)
    # the commit (and "+dirty") now, as the code measured is loaded: a tree edited during the run
    # does not become what was measured
    prov = provenance(command, [target, draft])
    runs, interrupted = measure(settings, loaded, progress=lambda s: print(s, file=sys.stderr, flush=True),
                                on_round=lambda runs: write_json(args.out / "runs_so_far.json", runs))
    cats = by_category(runs)
    same = identity(runs)
    budget_lines, checks = budget(cats, drafts)
    record = {"format": "specmac.bench.workloads/1", "interrupted": interrupted,
              "provenance": prov, "settings": settings.to_dict(),
              "prompt_tokens": {p["id"]: len(loaded.targets[tb].encode(settings.prompt_text(
                  loaded.targets[tb], p))) for p in prompts},
              "results": aggregate(runs, True), "categories": cats, "greedy_identity": same,
              "budget": checks, "runs": runs}
    write_json(args.out / "results.json", record)
    save_figure(figure(cats, f"Speedup per category (draft {Path(draft).name} -> {tb} {Path(target).name}"
                             f"{''.join(', ' + kv for kv in args.target_opt)}, greedy)"),
                args.out / "speedup_by_category.png")
    bad = [f"{r['config']} on {r['prompt']}" for r in same if not r["same"]]
    opts = "".join(f", {kv}" for kv in args.target_opt)
    lines = [f"# Drafts per workload category (model draft: gguf `{Path(draft).name}` -> target: "
             f"{tb} `{Path(target).name}`{opts}, greedy)", "",
             f"`{command}`", "",
             f"{len(prompts)} prompts ({', '.join(p['id'] for p in prompts)}; prompt tokens "
             + ", ".join(f"{k} {v}" for k, v in record["prompt_tokens"].items())
             + f") through the chat template, {args.max_tokens} new tokens ({args.edit_tokens} for code "
             f"editing), {args.repeats} rounds; K = {args.k}"
             + "".join(f", {d}: K = {','.join(map(str, ks))}" for d, ks in ks_for.items()) + ".",
             "", f"Greedy output identical to plain decoding: {len(same) - len(bad)} of {len(same)} "
             f"(configuration, prompt) pairs" + (f"; differs: {', '.join(bad)}" if bad else "") + ".", ""]
    lines += ["## Per category: K auto, the best fixed K, the hybrid against its rivals", ""] + budget_lines
    lines += category_markdown(cats) + ["## Medians per run", ""] + medians(runs)
    lines += ["![speedup by category](speedup_by_category.png)", ""]
    (args.out / "README.md").write_text("\n".join(lines), "utf-8")
    for r in cats:
        if r["category"] == ALL:
            print(r["config"], r.get("speedup"), r.get("end_to_end_speedup"), r["sources"])


if __name__ == "__main__":
    main()
