"""What the CLI prints, from numbers it is given: the stats block, the legend, verify's table and
verdict, the backends list (see docs/usage.md, "What the stats mean")."""

from __future__ import annotations

import json
from collections import Counter

import click

from specmac.errors import BrokenBackend, SpecmacError

LEGEND = {"accepted": "accepted draft", "corrected": "target correction", "bonus": "bonus token"}
STYLE = {"accepted": "green", "corrected": "red", "bonus": "cyan", "target": None}
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def legend() -> str:
    return "legend: " + "  ".join(click.style(text, fg=STYLE[kind]) for kind, text in LEGEND.items())


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 'es' if noun.endswith('s') else 's'}"


def _pct(part: float, total: float) -> str:
    return f"{part / total:.0%}" if total > 0 else "-"


def stats_block(r: dict, speculative: bool) -> list[str]:
    """The compact summary printed after the text (docs/usage.md, "What the stats mean", explains
    every line; a test holds the two together)."""
    tps = r["tokens_per_second"]
    lines = [f"{_n(r['n_tokens'], 'token')} in {r['seconds']:.2f} s = "
             f"{'-' if tps is None else f'{tps:.1f}'} tokens/s  "
             f"(prompt {_n(r['n_prompt_tokens'], 'token')}, {_n(r['n_target_passes'], 'target pass')}, "
             f"finish: {r['finish_reason']})"]
    if speculative:
        rate, tpp = r["acceptance_rate"], r["tokens_per_target_pass"]
        lines.append(f"acceptance {'-' if rate is None else f'{rate:.1%}'}  "
                     f"tokens per target pass {'-' if tpp is None else f'{tpp:.2f}'}  (k={r['k']})")
        per = " ".join("-" if a is None else f"{a:.2f}" for a in r["per_position_acceptance"])
        lines.append(f"per-position acceptance: {per or '-'}")
        policy = r.get("k_policy", {})
        history = r.get("k_steps") if policy else None
        if history:
            counts = sorted(Counter(history).items())
            lines.append("K per step: " + ", ".join(f"{_n(n, 'step')} at {k}" for k, n in counts)
                         + ("  (0 = no drafts: none was predicted to beat a plain step, or the last "
                            "token of --max-tokens)" if counts[0][0] == 0 else ""))
        sources = r.get("steps_by_source") or {}
        if policy and len(sources) > 1:
            lines.append("steps by source: " + ", ".join(f"{s} {n}" for s, n in sorted(sources.items())))
        costs = policy.get("costs", {})
        if costs.get("note"):
            lines.append(f"pass costs: {costs['note']}")
        if policy.get("settled"):
            lines.append(f"after the run: {policy['settled']}")
        if policy.get("note"):
            lines.append(f"K choice: {policy['note']}")
    if r.get("threads"):
        lines.append("CPU threads: " + ", ".join(f"{role} {why}" for role, why in r["threads"].items()))
    ts, total = r["time_split"], r["seconds"]
    lines.append(f"time: draft {_pct(ts['draft'], total)}  verify {_pct(ts['verify'], total)}  "
                 f"other {_pct(ts['other'], total)}  (prompt prefill {r['prefill_seconds']:.2f} s, "
                 "not counted)")
    if r.get("prompt_format"):
        lines.append(f"prompt: {r['prompt_format']}")
    if "prediction" in r:
        pr = r["prediction"]
        lines.append(f"prediction: {pr['accepted_prediction_tokens']} of {pr['prediction_tokens']} tokens "
                     f"accepted, {pr['rejected_prediction_tokens']} rejected")
    if "baseline" in r:
        b, sp = r["baseline"], r["speedup"]
        btps = b["tokens_per_second"]
        lines.append(f"baseline (plain): {b['n_tokens']} tokens, "
                     f"{'-' if btps is None else f'{btps:.1f}'} tokens/s  ->  speedup "
                     f"{'n/a' if sp is None else f'{sp:.2f}x'}")
        if note := _baseline_threads(b.get("thread_counts")):
            lines.append(note)
    if r["finish_reason"] == "interrupted":
        lines.append("interrupted: the text above is what was generated before Ctrl-C")
    return lines


def _threads_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{role} {n}" for role, n in counts.items()) or "-"


def _baseline_threads(counts: dict | None) -> str | None:
    """Whether the baseline ran at the CPU threads its run did: a line that says so, or that it did
    not (then the speedup also holds the machine's load changing between the two)."""
    if not counts or not any((*counts["run"].values(), counts["baseline"])):
        return None  # no backend here fits its thread count
    run, base = counts["run"], counts["baseline"]
    target = {"target": base["target"]} if "target" in base else {}
    if run["start"].get("target") == run["end"].get("target") == base.get("target"):
        return ("baseline measured like the run: right after it, at the same CPU threads "
                f"({_threads_text(target)})")
    return (f"baseline NOT at the run's CPU threads (run: {_threads_text(run['start'])} at its start, "
            f"{_threads_text(run['end'])} at its end; baseline: {_threads_text(base)}): the load on "
            "the machine changed, and the speedup holds that change too")


def turn_line(r: dict, n_prompt: int, speculative: bool) -> str:
    """`specmac chat`'s line after a reply: its speed, the prompt tokens the caches already held."""
    tps, rate = r["tokens_per_second"], r["acceptance_rate"]
    spec = f"acceptance {'-' if rate is None else f'{rate:.0%}'}, " if speculative else ""
    return (f"[{_n(r['n_tokens'], 'token')} in {r['seconds']:.2f} s = {'-' if tps is None else f'{tps:.1f}'} "
            f"tokens/s; prompt {_n(n_prompt, 'token')}, {r['cached_tokens']} reused; {spec}"
            f"finish: {r['finish_reason']}]")


def tenths(total: int, unit: str):
    """A progress callback (n more done) that prints a line on stderr at each tenth of ``total``
    ``unit`` (a long check off a terminal: verify's sampling, verify --endpoint's requests)."""
    done, shown = [0], [0]

    def tick(n: int) -> None:
        done[0] += n
        if 10 * done[0] >= (shown[0] + 1) * total:
            shown[0] = min(10, 10 * done[0] // total)
            click.echo(f"verify: {10 * shown[0]}% ({done[0]} of {total} {unit})", err=True)

    return tick


def show_verdict(res: dict, lines: list[str], as_json: bool) -> None:
    """A check's record as one JSON object, or its lines, a blank line and its verdict."""
    if as_json:  # as app.emit_json writes it (app imports this module: no import back)
        click.echo(json.dumps(res, indent=2, default=str))
        return
    for line in lines:
        click.echo(line)
    click.echo("")
    click.echo(res["verdict"])


# --- verify ----------------------------------------------------------------------------------


KINDS = ("accepted", "corrected", "bonus", "target")


def verify_table(res: dict) -> list[str]:
    kinds = res.get("n_by_kind", {})
    decisive = res.get("decisive_test", "-")
    rows = [("decisive test", f"{decisive}: chi-square {res['chi2']:.1f} on {res['dof']} dof "
                              f"({res['n_categories']} categories)"),
            ("p-value", f"{res['p_value']:.3g} (Holm-adjusted over {res.get('n_tests', 1)} tests)"),
            ("sequences per method", f"{res['n_samples_per_method']} x {res['positions']} tokens "
                                     f"({res['n_tokens_per_method']} tokens generated)"),
            ("tokens tested", ", ".join(f"{kinds[x]} {x}" for x in KINDS if x in kinds)
                              + f"; {kinds.get('end', 0)} sequences ended early"),
            ("min detectable TV", f"{res['min_detectable_tv']:.3f} per (context, position) "
                                  "(80% power, 5% family-wise)"),
            ("greedy agreement", f"{res['greedy_agreement']:.0%} of {len(res['contexts'])} contexts, "
                                 f"{res['greedy_tokens']} tokens each")]
    width = max(len(r[0]) for r in rows)
    out = [f"{name:<{width}}  {value}" for name, value in rows]
    if res.get("per_position"):
        out += ["", "position  p-value  min TV  accepted corrected  bonus target"]
        for r in res["per_position"]:
            kd = r.get("kinds", {})
            out.append(f"{r['test'].split()[1]:>8}  {r['p_value']:7.3f}  {r['min_detectable_tv']:6.3f}  "
                       f"{kd.get('accepted', 0):8d} {kd.get('corrected', 0):9d} {kd.get('bonus', 0):6d} "
                       f"{kd.get('target', 0):6d}")
    return out


def verdict(res: dict) -> str:
    """Plain language: the outcome, what the tests would have caught and what they cannot see."""
    from specmac.lossless.greedy import summary

    p, tv, n = res["p_value"], res["min_detectable_tv"], res["positions"]
    bad_greedy = [m for m in res.get("greedy_mismatches", []) if not m.get("near_tie")]
    if res["dof"] < 1:
        return ("NO VERDICT: every position fell into one category (rare tokens are pooled), so there "
                "is nothing to compare: raise --tokens or lower --temperature.")
    if p < 0.001 or bad_greedy:
        what = (f"speculative and plain samples differ (p = {p:.2g}, {res.get('decisive_test')})"
                if p < 0.001 else "greedy speculative and plain outputs part where no rounding can "
                                  "explain it")
        head = (f"FAIL: {what}: the output is not the target's distribution; check the vocabularies "
                "and `specmac probe-parallelism`.")
    elif p < 0.05:
        head = (f"INCONCLUSIVE: p = {p:.2g} is low but not alarming (1 honest run in 20 gets "
                "p < 0.05): rerun with another --seed or more --tokens.")
    else:
        head = f"PASS: no difference detected between speculative and plain decoding (p = {p:.2g})."
    kinds = res.get("n_by_kind", {})
    tested = ("Tested: " + ", ".join(f"{kinds[x]} {x}" for x in KINDS if x in kinds)
              + " tokens; a sequence that stopped early (EOS) counts as 'end' at every later position."
              if kinds else "")
    can = (f"Can detect: with 80% power, a shift of total variation >= {tv:.3f} in the distribution of the "
           f"token at any one position 1..{n} after any one of the {len(res['contexts'])} contexts (one "
           "group on its own, not diluted over the mixture of groups; TV over the categories kept, rare "
           "tokens pooled), and shifts in the joint distribution of neighbouring tokens and of the first "
           "three tokens.")
    cannot = ("Cannot detect: smaller shifts, shifts among the pooled rare tokens, dependence between "
              "tokens further apart (the synthetic tests check joint distributions exactly), positions "
              f"after {n}, other contexts or sampling settings. More --tokens lowers the detectable TV "
              "by less than 1/sqrt(tokens), because rare tokens leave the pool and add categories.")
    lines = [head] + ([tested] if tested else []) + [can, cannot]
    if res["n_categories"] < 10 and res["dof"] >= 1:
        lines.append(f"Only {res['n_categories']} categories in the decisive test: raise --tokens, or "
                     "sample a narrower distribution (lower --temperature, --top-k), so that more tokens "
                     "count on their own.")
    for m in res.get("greedy_mismatches", []):
        lines.append(f"Greedy, context {m['context'] + 1}: {summary(m)}.")
    return "\n".join(lines)


# --- backends --------------------------------------------------------------------------------

def backend_rows() -> list[dict]:
    """One row per registered backend: installed?, library and version, devices, or why not."""
    from specmac.backends import backend_class, library_version, registry

    rows = []
    for name, entry in registry().items():
        row = {"name": name, "entry": entry, "installed": False, "library": None, "version": None,
               "devices": [], "problem": None}
        try:
            cls = backend_class(name)
            row.update(installed=True, library=cls.library, version=library_version(cls.library),
                       devices=list(cls.devices()))
        except BrokenBackend as e:  # listed with the reason, never a crash of the listing itself
            row.update(problem=str(e), broken=True)
        except SpecmacError as e:
            row["problem"] = str(e)
        rows.append(row)
    return rows


def list_backends(as_json: bool) -> None:
    rows = backend_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = (f"{r['library']} {r['version']}  devices: {', '.join(r['devices'])}"
                 if r["installed"] else f"{'broken' if r.get('broken') else 'not installed'}: {r['problem']}")
        click.echo(f"{r['name']:<{width}}  {state}")
    click.echo("drafters without a model: lookup (prompt lookup that bets only on a worthwhile match), "
               "ngram (prompt lookup, any match), none (plain); LOOKUP+BACKEND (e.g. lookup+gguf) "
               "is a hybrid: lookup where its match is good enough, else the model")


def option_rows(name: str) -> list[dict]:
    """The --target-opt/--draft-opt keys of backend ``name``, from its own option table."""
    from specmac.backends import backend_class

    return [{"key": key, "type": opt.type.__name__, "default": opt.default,
             "choices": list(opt.choices) if opt.choices else None, "help": opt.help}
            for key, opt in backend_class(name).options.items()]


def _default(value) -> str:
    return "computed" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def options_markdown(name: str) -> str:
    """Backend ``name``'s options as the Markdown table docs/usage.md holds (a test compares them)."""
    lines = ["| key | type | default | what |", "|---|---|---|---|"]
    for r in option_rows(name):
        choices = f" (one of: {', '.join(map(str, r['choices']))})" if r["choices"] else ""
        what = f"{r['help']}{choices}".replace("|", "\\|")  # a | inside a cell ends it
        lines.append(f"| `{r['key']}` | {r['type']} | `{_default(r['default'])}` | {what} |")
    return "\n".join(lines)


def list_options(as_json: bool) -> None:
    """Every installed backend's options: key, type, default ("computed": from the model, the
    device or the load, as the text says), what it does."""
    rows = {r["name"]: option_rows(r["name"]) for r in backend_rows() if r["installed"]}
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for name, opts in rows.items():
        click.echo(f"{name} (--target-opt / --draft-opt KEY=VALUE)")
        width = max((len(o["key"]) for o in opts), default=0)
        for o in opts:
            choices = f" (one of: {', '.join(map(str, o['choices']))})" if o["choices"] else ""
            click.echo(f"  {o['key']:<{width}}  {o['type']:<5}  default {_default(o['default'])}: "
                       f"{o['help']}{choices}")


def under_load(measure) -> dict:
    """measure() -> its record, with the machine's load before and after it ("machine_load"): a
    busy machine's timings are slower and noisier, and the record should say so."""
    from specmac.tuning.machine import machine_load

    before = machine_load()
    record = measure()
    record["machine_load"] = {"before": before.as_dict(), "after": machine_load().as_dict()}
    return record


def busy_line(record: dict) -> str | None:
    """The warning for a record measured on a busy machine (the busier of before and after), or None."""
    from specmac.tuning.machine import MachineLoad

    loads = [MachineLoad(**m) for m in (record.get("machine_load") or {}).values()]
    busy = [m for m in loads if m.busy]
    if not busy:
        return None
    return "warning: " + max(busy, key=lambda m: (m.others_running or 0, m.load_1m)).describe()
