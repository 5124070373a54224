"""tables.md and PNG plots of bench/anatomy.py's results.json (no re-run).

    python bench/anatomy.py --report --out results/anatomy
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import numpy as np

from specmac.compare.results import plot_parallelism, save_figure

DRAFT_NAMES = {"gguf-q4": "gguf Q4_K_M 0.5B", "torch-bf16": "torch bf16 0.5B", "mlx-fp32": "mlx fp32 0.5B",
               "ngram": "n-gram lookup"}
TARGET_NAMES = {"gguf-q4": "gguf Q4_K_M 1.5B", "gguf-f16": "gguf F16 1.5B", "torch-bf16": "torch bf16 1.5B",
                "torch-fp32": "torch fp32 1.5B"}
ADVISE_LABELS = {"gguf-q4": ("gguf", "Q4_K_M"), "gguf-f16": ("gguf", "F16"),
                 "torch-bf16": ("torch", "bfloat16"), "torch-fp32": ("torch", "float32"),
                 "mlx-fp32": ("mlx", "float32")}


TIMES, DASH = "\u00d7", "\u2013"


def med(stat: dict | None, key: str = "median") -> float | None:
    return stat[key] if stat else None


def fmt(v, spec: str = ".2f", unit: str = "") -> str:
    return "\u2013" if v is None else f"{v:{spec}}{unit}"


def advise_at(record: dict, temp: float) -> dict | None:
    """advise's ranking record at this temperature, if it ranked there."""
    return next((r for r in record.get("advise", []) if r["sampling"]["temperature"] == temp), None)


def advise_row(record: dict, temp: float, draft: str | None, target: str) -> dict | None:
    """advise's ranking entry for this (draft, target) at this temperature (draft None: plain)."""
    rank = advise_at(record, temp)
    if rank is None:
        return None
    tb, tp = ADVISE_LABELS[target]
    for e in rank["ranking"]:
        if (e["target"], e["target_dtype"]) != (tb, tp):
            continue
        if draft is None and e["k"] == 0:
            return e
        if draft == "ngram" and e["draft"] == "ngram":
            return e
        if draft and draft != "ngram" and e["k"] and (e["draft"], e["draft_dtype"]) == ADVISE_LABELS[draft]:
            return e
    return None


def predicted(e: dict | None, k) -> float | None:
    if e is None:
        return None
    if k == 0 or e["k"] == 0:
        return e["predicted_tokens_per_second"] if k == 0 else None
    if k == "auto":
        return e["predicted_tokens_per_second"]
    by_k = e.get("by_k") or []
    return by_k[k - 1] if 0 < k <= len(by_k) else None


def fastest_plain(record: dict) -> dict[tuple[str, float], float]:
    """(precision group, T) -> the fastest measured plain decoder's tokens/s (median)."""
    out: dict[tuple[str, float], float] = {}
    for m in record["measured"]:
        base = next(r for r in m["results"] if r["draft"] == "none")
        key = (m["group"], m["temperature"])
        out[key] = max(out.get(key, 0.0), med(base["tokens_per_second"]) or 0.0)
    return out


def target_table(record: dict, m: dict, plain: dict) -> list[str]:
    t, temp = m["target"], m["temperature"]
    best_plain = plain[(m["group"], temp)]
    base_row = advise_row(record, temp, None, t)
    lines = [f"### {TARGET_NAMES[t]}, T = {temp:g}", "",
             f"Parallelism probe: T(1) = {m['probe']['t1_ms']:.1f} ms, \u03b2 = {m['probe']['beta']:.2f} "
             f"({m['probe']['verdict']}). Speedups are over the fastest plain decoder of the {m['group']} "
             f"group ({best_plain:.1f} tokens/s).", "",
             "| draft | K | tokens/s (median, IQR over runs) | speedup | vs own plain | acceptance | "
             "tokens/pass | per-position acceptance | advise predicted tokens/s |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in m["results"]:
        tps = r["tokens_per_second"]
        draft = None if r["draft"] == "none" else r["draft"]
        k = 0 if draft is None else r["k"]
        pred = predicted(base_row if draft is None else advise_row(record, temp, draft, t), k)
        k_txt = "plain" if draft is None else (f"auto (median {fmt(r.get('k_chosen_median'), '.0f')}, "
                                               f"{fmt(r.get('share_no_drafts'), '.0%')} without drafts)"
                                               if k == "auto" else str(k))
        per = " ".join(fmt(a, ".2f") for a in (r["per_position_acceptance"] or [])[:8])
        lines.append(f"| {DRAFT_NAMES.get(draft, 'none')} | {k_txt} | {fmt(med(tps), '.1f')} "
                     f"({fmt(med(tps, 'p25'), '.1f')}\u2013{fmt(med(tps, 'p75'), '.1f')}) | "
                     f"{fmt((med(tps) or 0) / best_plain, '.2f', TIMES)} | "
                     f"{fmt(med(r['speedup']), '.2f', TIMES)} | "
                     f"{fmt(r['acceptance_rate'], '.2f')} | {fmt(r['tokens_per_target_pass'], '.2f')} | "
                     f"{per or DASH} | {fmt(pred, '.1f')} |")
    for p in m.get("peers", []):
        lines.append(f"| peer: {p['peer']} | \u2013 | {p['tokens_per_second']:.1f} | "
                     f"{p['tokens_per_second'] / best_plain:.2f}\u00d7 | "
                     f"{p['speedup']:.2f}\u00d7 (its own plain: "
                     f"{p['target_tokens_per_second']:.1f}) | \u2013 | \u2013 | \u2013 | \u2013 |")
    return lines + [""]


def plots(record: dict, out: Path) -> list[str]:
    from matplotlib.figure import Figure

    names = []
    probes = [{**m["probe"], "label": f"{TARGET_NAMES[m['target']]}: \u03b2 {m['probe']['beta']:.2f}"}
              for m in record["measured"] if m["temperature"] == record["measured"][0]["temperature"]]
    if probes:
        plot_parallelism(probes, out / "parallelism.png", title="T(n): batched vs n one-token passes")
        names.append("parallelism.png")
    temps = sorted({m["temperature"] for m in record["measured"]})
    plain = fastest_plain(record)
    fig = Figure(figsize=(5.2 * len(temps), 4.6))
    axes = fig.subplots(1, len(temps), squeeze=False)[0]
    for ax, temp in zip(axes, temps):
        for m in (m for m in record["measured"] if m["temperature"] == temp):
            for draft in dict.fromkeys(r["draft"] for r in m["results"] if r["draft"] != "none"):
                rows = [r for r in m["results"] if r["draft"] == draft and r["k"] != "auto"]
                ax.plot([r["k"] for r in rows],
                        [(med(r["tokens_per_second"]) or 0) / plain[(m["group"], temp)] for r in rows],
                        marker="o", ms=3,
                        label=f"{DRAFT_NAMES.get(draft, draft)} \u2192 {TARGET_NAMES[m['target']]}")
        ax.axhline(1.0, color="k", ls="--", lw=1)
        ax.set_title(f"T = {temp:g}", fontsize=10)
        ax.set_xlabel("K")
        ax.set_ylabel("speedup over the fastest plain decoder of the precision")
        ax.grid(alpha=0.3)
    handles = max((ax.get_legend_handles_labels() for ax in axes), key=lambda hl: len(hl[0]))
    axes[-1].legend(*handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, out / "speedup_vs_k.png")
    names.append("speedup_vs_k.png")
    return names


def headline(record: dict) -> list[str]:
    """Per precision group and temperature: the fastest measured configuration and advise's first
    choice (with what it measured), then auto against the best fixed K and plain decoding."""
    plain = fastest_plain(record)
    lines = ["| precision (target) | T | fastest measured | tokens/s | speedup | advise's first choice "
             "| its measured tokens/s | first choice / fastest |",
             "|---|---:|---|---:|---:|---|---:|---:|"]
    autos = ["| draft \u2192 target | T | auto tokens/s | best fixed K (tokens/s) | plain tokens/s | "
             "auto / best of fixed K and plain: by total time | per run, geometric mean | "
             "per run, median (range) | ratio of median speedups | "
             "K auto chose (median, share without drafts) |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for m in record["measured"]:
        temp, t = m["temperature"], m["target"]
        rows = [r for r in m["results"] if r["tokens_per_second"]]
        top = max(rows, key=lambda r: med(r["tokens_per_second"]))
        rank = advise_at(record, temp)
        tb, tp = ADVISE_LABELS[t]
        first = next((e for e in (rank or {}).get("ranking", [])
                      if (e["target"], e["target_dtype"]) == (tb, tp)), None)
        chosen = None
        if first is not None:
            for r in rows:
                d = r["draft"]
                same = (first["k"] == 0 and d == "none") or (
                    first["k"] and r["k"] == first["k"] and d != "none"
                    and (first["draft"] == "ngram" if d == "ngram" else
                         ADVISE_LABELS.get(d) == (first["draft"], first["draft_dtype"])))
                if same:
                    chosen = r
        name = _label(top)
        first_name = ("\u2013" if first is None else f"plain {first['target_label']}" if not first["k"]
                      else f"{first['draft_label']} \u2192 {first['target_label']}, K = {first['k']}")
        ctps = med(chosen["tokens_per_second"]) if chosen else None
        ttps = med(top["tokens_per_second"])
        lines.append(f"| {TARGET_NAMES[t]} | {temp:g} | {name} | {ttps:.1f} | "
                     f"{ttps / plain[(m['group'], temp)]:.2f}{TIMES} | {first_name} | "
                     f"{fmt(ctps, '.1f')} | {fmt(ctps / ttps if ctps else None, '.2f')} |")
        base = next(r for r in rows if r["draft"] == "none")
        for d in dict.fromkeys(r["draft"] for r in rows if r["draft"] != "none"):
            auto = next((r for r in rows if r["draft"] == d and r["k"] == "auto"), None)
            fixed = [r for r in rows if r["draft"] == d and r["k"] != "auto"]
            if auto is None or not fixed:
                continue
            bf = max(fixed, key=lambda r: med(r["tokens_per_second"]))
            # paired speedups: each run over the plain run of its own round (drafts measured in another
            # group than the first plain row have their own plain runs)
            ratio = (med(auto["speedup"]) or 0) / max(med(bf["speedup"]) or 0, 1.0)
            per_run, total = auto_vs_best(m["runs"], auto, bf if (med(bf["speedup"]) or 0) >= 1.0 else base)
            q = sorted(per_run)
            atps, btps = med(auto["tokens_per_second"]), med(bf["tokens_per_second"])
            autos.append(f"| {DRAFT_NAMES.get(d, d)} \u2192 {TARGET_NAMES[t]} | {temp:g} | {atps:.1f} | "
                         f"K = {bf['k']} ({btps:.1f}) | {med(base['tokens_per_second']):.1f} | "
                         f"{total:.2f} | {float(np.exp(np.mean(np.log(q)))):.2f} | "
                         f"{median(q):.2f} ({q[0]:.2f}{DASH}{q[-1]:.2f}) | "
                         f"{ratio:.2f} | {fmt(auto.get('k_chosen_median'), '.0f')}, "
                         f"{fmt(auto.get('share_no_drafts'), '.0%')} |")
    return lines + [""] + autos + [""]


def auto_vs_best(runs: list[dict], auto: dict, best: dict) -> tuple[list[float], float]:
    """auto's runs against the best configuration's (fixed K, or plain where plain is faster) of
    the same prompt and round: the ratio of tokens/s of every pair, and that of total tokens over
    total time. The pair of a run is the nearest run of that configuration with the same prompt
    and round (drafts measured apart each have their own plain runs; a round runs every
    configuration of its batch once, side by side)."""
    def key(x: dict) -> tuple:
        return x["prompt"], x["round"]

    others = [(i, x) for i, x in enumerate(runs) if x["config"] == best["config"]]
    pairs = []
    for i, a in enumerate(runs):
        if a["config"] == auto["config"]:
            near = [(abs(i - j), j) for j, b in others if key(b) == key(a)]
            if near:
                pairs.append((a, runs[min(near)[1]]))
    per_run = [a["tokens_per_second"] / b["tokens_per_second"] for a, b in pairs]
    total = (sum(a["n_tokens"] for a, _ in pairs) / sum(a["seconds"] for a, _ in pairs)
             / (sum(b["n_tokens"] for _, b in pairs) / sum(b["seconds"] for _, b in pairs)))
    return per_run, total


def prediction_accuracy(record: dict) -> list[float]:
    """measured / predicted tokens/s for every fixed-K and plain cell advise predicted."""
    return [x for xs in accuracy_by_configuration(record).values() for x in xs]


def accuracy_by_configuration(record: dict) -> dict[tuple[str, str, float], list[float]]:
    """(draft, target, T) -> measured / predicted tokens/s of its fixed-K (or plain) cells."""
    ratios: dict[tuple[str, str, float], list[float]] = {}
    for m in record["measured"]:
        for r in m["results"]:
            if r["k"] == "auto" or not r["tokens_per_second"]:
                continue
            draft = None if r["draft"] == "none" else r["draft"]
            row = advise_row(record, m["temperature"], draft, m["target"])
            pred = predicted(row, 0 if draft is None else r["k"])
            if pred:
                key = (r["draft"], m["target"], m["temperature"])
                ratios.setdefault(key, []).append(med(r["tokens_per_second"]) / pred)
    return ratios


def accuracy_table(record: dict) -> list[str]:
    lines = ["| draft \u2192 target | T | cells | measured / predicted, median (range) | within \u00b115% |",
             "|---|---:|---:|---|---:|"]
    for (d, t, temp), xs in accuracy_by_configuration(record).items():
        mid, lo, hi, within = spread(xs)
        name = "plain" if d == "none" else DRAFT_NAMES.get(d, d)
        lines.append(f"| {name} \u2192 {TARGET_NAMES[t]} | {temp:g} | {len(xs)} | {mid:.2f} "
                     f"({lo:.2f}{DASH}{hi:.2f}) | {within}/{len(xs)} |")
    return lines + [""]


def causes(record: dict) -> dict[tuple[str, str, float], dict[str, float]]:
    """(draft, target, T) -> where measured / predicted tokens/s comes from, over its fixed-K and
    plain cells: per run, measured / predicted for ``tokens`` per target pass (acceptance: the
    anatomy's texts against advise's), the ``target``'s time per step (against advise's probe of
    the pass at the width the run verified, interpolated, plus the loop's time per step) and the
    ``draft``'s time per drafted token (its prefill of the prompt, as advise timed it, taken out;
    against its one-token pass, sampling included); medians over a cell's runs (a shared machine
    stalls some), then over the configuration's cells."""
    out: dict[tuple[str, str, float], dict[str, list[float]]] = {}
    for m in record["measured"]:
        temp = m["temperature"]
        rank = advise_at(record, temp)
        if rank is None:
            continue
        tb, tp = ADVISE_LABELS[m["target"]]
        probe = next(x for x in rank["targets"] if (x["backend"], x["precision"]) == (tb, tp))
        widths = range(1, len(probe["t_pass_ms"]) + 1)
        for r in m["results"]:
            draft = None if r["draft"] == "none" else r["draft"]
            k = 0 if draft is None else r["k"]
            e = advise_row(record, temp, draft, m["target"])
            if k == "auto" or not predicted(e, k):
                continue
            tpp_pred = 1.0 if k == 0 else next(
                a["tokens_per_pass"][k - 1] for a in rank["acceptance"]
                if (a["draft"], a["target"]) == (e["draft_label"], e["target_label"]))
            d_probe = None if draft is None else next(
                x for x in rank["drafts"] if (x["backend"], x["precision"]) == (
                    ("ngram", "lookup") if draft == "ngram" else ADVISE_LABELS[draft]))
            t_draft = d_probe and 1e-3 * d_probe["t_pass_ms"]
            prefill = 1e-3 * (d_probe or {}).get("prefill_ms", 0.0)  # advise's of its (median) prompt
            got: dict[str, list[float]] = {}
            for x in (x for x in m["runs"] if x["config"] == r["config"]):
                passes = x["n_target_passes"]
                width = 1 + x["n_drafted"] / passes
                t_pass = float(np.interp(width, widths, probe["t_pass_ms"]))
                t_pred = 1e-3 * (t_pass + probe["loop_ms_per_step"])
                got.setdefault("tokens", []).append(x["n_tokens"] / passes / tpp_pred)
                got.setdefault("target", []).append((x["t_verify"] + x["t_other"]) / passes / t_pred)
                if t_draft and x["n_drafted"]:
                    got.setdefault("draft", []).append((x["t_draft"] - prefill) / x["n_drafted"] / t_draft)
            acc = out.setdefault((r["draft"], m["target"], temp), {})
            for name, v in got.items():
                acc.setdefault(name, []).append(median(v))
    speed = accuracy_by_configuration(record)
    return {key: {"speed": median(speed[key]), **{name: median(v) for name, v in d.items()}}
            for key, d in out.items()}


def causes_table(record: dict) -> list[str]:
    """Per configuration: measured / predicted tokens/s beside its parts (medians over its cells)."""
    lines = ["| draft \u2192 target | T | tokens/s, measured / predicted | tokens per target pass "
             "| target's time per step | draft's time per drafted token, less its prefill |",
             "|---|---:|---:|---:|---:|---:|"]
    for (d, t, temp), c in causes(record).items():
        name = "plain" if d == "none" else DRAFT_NAMES.get(d, d)
        lines.append(f"| {name} \u2192 {TARGET_NAMES[t]} | {temp:g} | {c['speed']:.2f} | {c['tokens']:.2f} | "
                     f"{c['target']:.2f} | {fmt(c.get('draft'), '.2f')} |")
    return lines + [""]


def accuracy_section(record: dict, title: str) -> list[str]:
    """The summary line over every cell advise predicted (at the temperatures it ranked), then the
    table per configuration; nothing where it predicted none."""
    ratios = prediction_accuracy(record)
    if not ratios:
        return []
    mid, lo, hi, within = spread(ratios)
    temps = ", ".join(f"{r['sampling']['temperature']:g}" for r in record.get("advise", []))
    return [f"{title} (T = {temps}) over {len(ratios)} cells (fixed K and plain): measured / predicted "
            f"median {mid:.2f}, range {lo:.2f}{DASH}{hi:.2f}; "
            f"within \u00b115%: {within / len(ratios):.0%}.", ""] + accuracy_table(record)


def spread(ratios: list[float]) -> tuple[float, float, float, int]:
    """Median, min, max of measured / predicted, and how many are within 15%."""
    q = sorted(ratios)
    return q[len(q) // 2], q[0], q[-1], sum(0.85 <= x <= 1.15 for x in q)


def _label(r: dict) -> str:
    if r["draft"] == "none":
        return "plain"
    return f"{DRAFT_NAMES.get(r['draft'], r['draft'])}, K = {r['k']}"


def main(directory: str) -> None:
    out = Path(directory)
    record = json.loads((out / "results.json").read_text())
    plain = fastest_plain(record)
    lines = ["## Headline", ""] + headline(record)
    lines += accuracy_section(record, "advise's prediction vs measurement")
    given = {**record, "advise": record.get("advise_on_anatomy_prompts", [])}
    lines += accuracy_section(given, "The same, advise given the anatomy's own prompts")
    for title, rec in (("advise on its own prompts", record), ("advise given the anatomy's prompts", given)):
        if rec.get("advise"):
            lines += [f"Where measured / predicted comes from, {title} (medians; measured / predicted "
                      "for each part):", ""] + causes_table(rec)
    lines += ["## Every cell", ""]
    for m in record["measured"]:
        lines += target_table(record, m, plain)
    names = plots(record, out)
    (out / "tables.md").write_text("\n".join(lines) + "\n" + "\n".join(f"![{n}]({n})" for n in names) + "\n")
    print(f"wrote {out / 'tables.md'}, " + ", ".join(str(out / n) for n in names))
