"""``specmac report``: summary.md and PNG plots of a compare record, from the record alone.

``render`` is what ``specmac compare`` writes at the end of a run and what ``specmac report``
redraws later from results.json, without re-running anything.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from specmac.compare import endpoint_report
from specmac.compare.categories import budget_markdown, category_markdown
from specmac.compare.measure import ADVISE_PROMPTS, AUTO, FORMAT, PLAIN
from specmac.compare.results import CPU_FEATURES
from specmac.errors import BadOption
from specmac.files import read_capped

MAX_RECORD_BYTES = 64 << 20  # a record of thousands of runs is a few MB


def check_rows(record: dict, path: Path) -> None:
    """What the headline and tables rank by: named pairings and finite measured numbers (a record
    edited to a null draft or a NaN speedup rendered a wrong headline)."""
    for i, row in enumerate(record["results"]):
        if not isinstance(row, dict):
            raise BadOption(f"{path}: results[{i}] is not an object: re-run specmac compare")
        for key in ("draft", "target", "config"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise BadOption(f"{path}: results[{i}].{key} is {row.get(key)!r}, not a name: re-run "
                                "specmac compare")
        for key in ("speedup", "tokens_per_second"):
            stat = row.get(key)
            if stat is None:
                continue
            values = stat.values() if isinstance(stat, dict) else [stat]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                       for v in values):
                raise BadOption(f"{path}: results[{i}].{key} holds {stat!r}, not finite numbers: re-run "
                                "specmac compare")


def load_record(directory: str | Path) -> dict:
    """results.json of a compare run, checked enough to render."""
    path = Path(directory) / "results.json"
    try:
        record = json.loads(read_capped(path, MAX_RECORD_BYTES, "record", "directory").decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadOption(f"{path} is not UTF-8 text (byte {e.start}): re-run specmac compare") from None
    except OSError:
        raise BadOption(f"directory {directory} has no results.json: give the output folder of a compare "
                        "run", param="directory") from None
    except json.JSONDecodeError as e:
        raise BadOption(f"{path} is not valid JSON ({e.msg}): re-run specmac compare") from None
    except RecursionError:  # the parser recurses once per level: a hostile file runs it out
        raise BadOption(f"{path} is JSON nested too deeply to be a compare record: re-run specmac "
                        "compare") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise BadOption(f"{path} is not a specmac compare record (format {FORMAT}): re-run specmac compare")
    for key, kind in (("settings", dict), ("results", list), ("predictions", dict), ("backends", dict)):
        if not isinstance(record.get(key), kind):
            raise BadOption(f"{path}: field {key!r} is missing or not a {kind.__name__}: re-run specmac "
                            "compare")
    check_rows(record, path)
    from specmac.compare.results import pyplot

    for fig in build(record, path)[1].values():  # every field the outputs read, read once up front
        pyplot().close(fig)
    return record


def build(record: dict, source: str | Path = "the record") -> tuple[str, dict]:
    """summary.md's text and the figures, in memory; a record with a missing or mistyped field is
    a BadOption naming it (nothing has been written yet)."""
    try:
        return summary_markdown(record), figures(record)
    except KeyError as e:
        problem = f"field {e.args[0]!r} is missing"
    except (TypeError, ValueError, AttributeError, IndexError) as e:
        problem = f"a field has the wrong type ({(str(e).splitlines() or [type(e).__name__])[0]})"
    except RecursionError:
        problem = "a field is nested too deeply"
    raise BadOption(f"{source}: {problem}: re-run specmac compare")


PLOTS = {"speedup_vs_k.png": "speedup over plain vs K, per pairing",
         "acceptance_vs_k.png": "acceptance rate vs K, per pairing",
         "measured_vs_predicted.png": "measured vs predicted speedup (cost model)"}


def render(record: dict, directory: str | Path) -> list[Path]:
    """Write summary.md and the PNG plots of ``record`` into ``directory``; return their paths."""
    from specmac.compare.results import save_figure

    text, figs = build(record)  # everything built before the first file is written: all or none
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.md").write_text(text, "utf-8")
    return [d / "summary.md"] + [save_figure(fig, d / name) for name, fig in figs.items()]


def label(row: dict) -> str:
    return f"{row['target']} only" if row["draft"] == PLAIN else f"{row['draft']} \u2192 {row['target']}"


def fmt(v: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "\u2013" if v is None else f"{v:{spec}}{unit}"


def med(stat: dict | None, key: str = "median") -> float | None:
    return stat[key] if stat else None


def best_rows(record: dict) -> list[dict]:
    """Per pairing, the measured configuration with the highest median speedup."""
    best: dict[str, dict] = {}
    for row in record["results"]:
        pid = f"{row['draft']}:{row['target']}"
        if row["draft"] != PLAIN and (pid not in best or
                                         (med(row["speedup"]) or 0) > (med(best[pid]["speedup"]) or 0)):
            best[pid] = row
    return sorted(best.values(), key=lambda r: -(med(r["speedup"]) or 0))


def headline(record: dict) -> str:
    """The one-sentence answer: which pairing and K to run, or that none pays here."""
    rows = best_rows(record)
    if not rows:
        return endpoint_report.headline(record) or "Nothing was measured."
    top = rows[0]
    pred = fmt(top.get("predicted_speedup"), ".2f", "\u00d7")
    tail = (f"{fmt(med(top['speedup']), '.2f', '×')} the speed of plain {top['target']} "
            f"({fmt(med(top['tokens_per_second']), '.1f')} tokens/s; the cost model predicted {pred})")
    if (med(top["speedup"]) or 0) > 1:
        return f"**Run {label(top)} at K={top['k']}:** {tail}."
    return (f"**No pairing beats plain decoding on this machine.** The best, {label(top)} at "
            f"K={top['k']}, runs at {tail}.")


def skipped_line(record: dict) -> str | None:
    """"N of M pairings skipped: PAIR: why; ..." where compare dropped pairings that cannot pair
    (every combination asked for, some vocabularies differ), else None."""
    skipped = [sk for sk in record.get("skipped_pairs") or [] if isinstance(sk, dict)]
    if not skipped:
        return None
    total = len(record["settings"].get("pairs") or []) + len(skipped)  # the measured ones, and these
    return (f"{len(skipped)} of {total} pairing{'s' * (total != 1)} skipped: "
            + "; ".join(f"{sk.get('pair')}: {sk.get('reason')}" for sk in skipped))


def summary_markdown(record: dict) -> str:
    prov, st = record["provenance"], record["settings"]
    machine = prov.get("machine", {})
    lines = ["# specmac compare", "", headline(record), ""]
    if record.get("interrupted"):
        lines += ["> Interrupted: only the complete rounds measured before Ctrl-C are included.", ""]
    elif record.get("complete") is False:
        lines += ["> Incomplete: the run stopped (killed or failed) after the rounds included here.", ""]
    if skipped := skipped_line(record):
        lines += [f"> {skipped}", ""]
    if not record["results"]:  # endpoints alone
        return "\n".join(lines + category_markdown(record.get("categories") or [])
                         + endpoint_report.markdown(record) + _method(record, st, prov, machine))
    lines += ["## Best K per pairing", "",
              "| pairing | best K | tokens/s | speedup | acceptance | predicted best K | predicted speedup |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in best_rows(record):
        adv = record["predictions"].get(f"{r['draft']}:{r['target']}", {})
        lines.append(f"| {label(r)} | {r['k']} | {fmt(med(r['tokens_per_second']), '.1f')} | "
                     f"{fmt(med(r['speedup']), '.2f', '×')} | {fmt(r['acceptance_rate'], '.3f')} | "
                     f"{adv.get('best_k', '–')} | {fmt(adv.get('predicted_speedup'), '.2f', '×')} |")
    cats = record.get("categories") or []
    lines += [""] + category_markdown(cats) + budget_markdown(cats) + endpoint_report.markdown(record)
    lines += ["## Every configuration", ""]
    for target in dict.fromkeys(r["target"] for r in record["results"]):
        lines += _target_table(record, target)
    lines += _method(record, st, prov, machine)
    lines += ["## Plots", ""] + [f"![{title}]({name})" for name, title in PLOTS.items()] + [""]
    return "\n".join(lines)


def _target_table(record: dict, target: str) -> list[str]:
    rows = [r for r in record["results"] if r["target"] == target]
    out = [f"### Target {target}", "",
           "| pairing | K | tokens/s median | tokens/s IQR | speedup median | speedup IQR | predicted "
           "speedup | acceptance | tokens/pass | predicted tokens/pass | per-position acceptance | "
           "time draft/verify/other | greedy match |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        tps, sp, ts = r["tokens_per_second"], r["speedup"], r["time_split"]
        per = " ".join(fmt(a, ".2f") for a in r["per_position_acceptance"] or [])
        split = "/".join(fmt(None if ts[p] is None else 100 * ts[p], ".0f")
                         for p in ("draft", "verify", "other"))
        out.append(
            f"| {label(r)} | {r['k'] or '–'} | {fmt(med(tps), '.1f')} | "
            f"{fmt(med(tps, 'p25'), '.1f')}–{fmt(med(tps, 'p75'), '.1f')} | {fmt(med(sp), '.2f', '×')} | "
            f"{fmt(med(sp, 'p25'), '.2f')}–{fmt(med(sp, 'p75'), '.2f')} | "
            f"{fmt(r.get('predicted_speedup'), '.2f', '×')} | {fmt(r['acceptance_rate'], '.3f')} | "
            f"{fmt(r['tokens_per_target_pass'], '.2f')} | {fmt(r.get('predicted_tokens_per_pass'), '.2f')} | "
            f"{per or '–'} | {split} % | {greedy_cell(r)} |")
    return out + [""]


def greedy_cell(r: dict) -> str:
    """Greedy match, and for the mismatches: near-tie flips or NOT (a bug)."""
    cell = fmt(r["greedy_match"], ".0%")
    mm = r.get("greedy_mismatches") or []
    if mm:
        ties = sum(m["near_tie"] for m in mm)
        parts = [f"{ties} near-tie flip{'s' * (ties != 1)}"] if ties else []
        parts += [f"{len(mm) - ties} NOT near-tie (bug)"] if len(mm) > ties else []
        first = ", ".join(f"{m['prompt']}@{m['first_difference'] + 1}" for m in mm)
        cell += f" ({'; '.join(parts)}; part at {first})"
    return cell


def _method(record: dict, st: dict, prov: dict, machine: dict) -> list[str]:
    errors = {p: a["error"] for p, a in record["predictions"].items() if "error" in a}
    s = st["sampling"]
    out = ["## How this was measured", "",
           f"- Command: `{prov.get('command')}`",
           f"- Git {prov.get('git_sha')}, {prov.get('utc')}, specmac {prov.get('specmac')}, "
           f"Python {prov.get('python')}; libraries: "
           + ", ".join(f"{k} {v}" for k, v in prov.get("libraries", {}).items() if v),
           f"- Machine: {machine.get('processor') or machine.get('machine')}"
           + (f" ({', '.join(machine['cpu_features']) or 'none of ' + ', '.join(CPU_FEATURES)})"
              if machine.get("cpu_features") is not None else "")
           + f", {machine.get('cpu_count')} CPUs, {machine.get('platform')}",
           f"- {len(st['prompts'])} prompts ({', '.join(st['prompts'])}) \u00d7 {st['repeats']} repeats, "
           f"{st['max_tokens']} new tokens each"
           + "".join(f" ({cat}: {n})" for cat, n in (st.get("max_tokens_for") or {}).items())
           + f", temperature {s['temperature']}"
           + (f", top-k {s['top_k']}" if s["top_k"] else "")
           + (f", top-p {s['top_p']}" if s["top_p"] < 1 else "")
           + (f", min-p {s['min_p']}" if s["min_p"] else "") + f", seed {st['seed']}."]
    if not record.get("results") and record.get("endpoint_runs"):  # endpoints alone: said in their section
        return out + [""]
    out += ["- Rounds are interleaved: each (prompt, repeat) runs every configuration once, in the order "
            "of the tables; one warm-up round of "
            f"{st['warmup_tokens']} tokens per configuration is discarded. Each target backend is loaded "
            "once and reset before every run, so no cache carries over.",
            "- tokens/s counts the decoding steps (draft, verify, bookkeeping; the draft's prefill of the "
            "prompt included, the target's excluded). Speedup is the median over runs of tokens/s divided "
            "by the plain run of the same target, prompt and round; IQR = 25th–75th percentile.",
            "- Acceptance and tokens per target pass are pooled over all runs; per-position acceptance is "
            "conditional (of the steps that reached draft position i, the fraction accepted). Greedy "
            "match: share of runs whose output equals the plain output (temperature 0 only); a "
            "mismatch names the prompt and the token where they part, and is a near-tie flip when the "
            "target's top-2 logit gap there is below its batched-vs-serial logit difference at that "
            "point, else NOT near-tie: a bug.",
            "- Predicted: `specmac.advise.pairing.advise_pair` for each pairing, run before the measurement "
            f"(acceptance from the first {ADVISE_PROMPTS} prompts)."]
    out += [f"- No prediction for {p}: {e}" for p, e in errors.items()]
    out += [f"- Not measured: {sk.get('pair')}: {sk.get('reason')}"
            for sk in record.get("skipped_pairs") or [] if isinstance(sk, dict)]
    out.append("- Backends: " + "; ".join(
        f"{role} {i.get('backend', i.get('drafter'))} ({i.get('model') or i.get('drafter')}, "
        f"{json.dumps(i.get('options', {}), sort_keys=True)})" for role, i in record["backends"].items()))
    return out + [""]


def _colors(record: dict) -> dict[str, str]:
    drafts = dict.fromkeys(r["draft"] for r in record["results"] if r["draft"] != PLAIN)
    return {d: f"C{i % 10}" for i, d in enumerate(drafts)}


def _series(record: dict, target: str) -> dict[str, list[dict]]:
    """draft -> its rows with this target at a fixed K, by K (K = auto has no place on a K axis)."""
    out: dict[str, list[dict]] = {}
    for r in sorted((r for r in record["results"] if r["k"] != AUTO), key=lambda r: r["k"]):
        if r["target"] == target and r["draft"] != PLAIN:
            out.setdefault(r["draft"], []).append(r)
    return out


def _panels(record: dict, height: float = 4.4):
    from matplotlib.figure import Figure

    targets = list(dict.fromkeys(r["target"] for r in record["results"]))
    fig = Figure(figsize=(4.4 * len(targets) + 0.6, height))
    axes = fig.subplots(1, len(targets), squeeze=False, sharey=True)[0]
    return fig, dict(zip(targets, axes))


def _legend_below(ax) -> None:
    """Below the panel, where it cannot hide a curve (lines span the whole K range); none where the
    panel has no labelled line (a run of K auto only draws none)."""
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def figures(record: dict) -> dict:
    """The plots as matplotlib Figures (name -> Figure), built from the record's numbers only."""
    if not record["results"]:
        return {}
    return {"speedup_vs_k.png": fig_speedup(record), "acceptance_vs_k.png": fig_acceptance(record),
            "measured_vs_predicted.png": fig_predicted(record)}


def _style_k_panel(ax, record: dict, target: str) -> None:
    """What every per-target panel against K shares: title, K axis, grid, legend."""
    ax.set_title(f"target: {target}", fontsize=10)
    ax.set_xlabel("K (draft tokens per step)")
    ax.set_xticks([k for k in record["settings"]["k"] if k != AUTO])
    ax.grid(alpha=0.3)
    _legend_below(ax)


def fig_speedup(record: dict):
    fig, panels = _panels(record)
    colors = _colors(record)
    for target, ax in panels.items():
        base = next((r for r in record["results"] if r["target"] == target and r["draft"] == PLAIN), None)
        for draft, rows in _series(record, target).items():
            rows = [r for r in rows if r["speedup"]]  # None when no run produced a token
            ks = [r["k"] for r in rows]
            m = [med(r["speedup"]) for r in rows]
            lo = [med(r["speedup"]) - med(r["speedup"], "p25") for r in rows]
            hi = [med(r["speedup"], "p75") - med(r["speedup"]) for r in rows]
            ax.errorbar(ks, m, yerr=[lo, hi], marker="o", ms=4, capsize=3, color=colors[draft],
                        label=f"{draft} \u2192 {target}")
        base_tps = fmt(med(base["tokens_per_second"]) if base else None, ".0f")
        ax.axhline(1.0, color="k", ls="--", lw=1, label=f"{target} only = 1.0 ({base_tps} tok/s)")
        _style_k_panel(ax, record, target)
    next(iter(panels.values())).set_ylabel("speedup over plain (median, IQR bars)")
    fig.suptitle("Speedup vs K", fontsize=11)
    return fig


def fig_acceptance(record: dict):
    fig, panels = _panels(record)
    colors = _colors(record)
    for target, ax in panels.items():
        for draft, rows in _series(record, target).items():
            pts = [(r["k"], r["acceptance_rate"]) for r in rows if r["acceptance_rate"] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=4, color=colors[draft], label=f"{draft} \u2192 {target}")
        ax.set_ylim(0, 1.05)
        _style_k_panel(ax, record, target)
    next(iter(panels.values())).set_ylabel("acceptance rate (accepted / drafted)")
    fig.suptitle("Acceptance vs K", fontsize=11)
    return fig


def fig_predicted(record: dict):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.2, 5.4))
    ax = fig.subplots()
    colors, markers = _colors(record), "osD^v<>p*h"
    targets = list(dict.fromkeys(r["target"] for r in record["results"]))
    pts_all = []
    for target in targets:
        for draft, rows in _series(record, target).items():
            pts = [(r["predicted_speedup"], med(r["speedup"]), r["k"]) for r in rows
                   if r.get("predicted_speedup") is not None and r["speedup"]]
            if not pts:
                continue
            x, y, ks = zip(*pts)
            ax.scatter(x, y, color=colors[draft], marker=markers[targets.index(target) % len(markers)],
                       s=28, label=f"{draft} \u2192 {target}")
            for xi, yi, k in pts:
                ax.annotate(str(k), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=6)
            pts_all += pts
    lim = max([1.2] + [max(p[0], p[1]) * 1.1 for p in pts_all])
    ax.plot([0, lim], [0, lim], color="gray", lw=1, label="measured = predicted")
    ax.axhline(1.0, color="k", ls="--", lw=1, label="plain decoding (1.0)")
    ax.axvline(1.0, color="k", ls=":", lw=0.8)
    ax.set_xlim(0, lim)
    ax.set_ylim(0, lim)
    ax.set_xlabel("predicted speedup (cost model)")
    ax.set_ylabel("measured speedup (median)")
    ax.set_title("Measured vs predicted speedup (numbers: K)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside: points fill the square
    return fig
