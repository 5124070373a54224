"""`specmac advise`: a ranking of configurations, or one pairing; attached to the main group on import."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator

import click

from specmac.cli.app import (
    UserError,
    load_pair,
    main,
    owned_outputs,
    parse_kv,
    report_record,
    sampling_options,
)
from specmac.cli.flags import command_lines, ctx_option
from specmac.cli.progress import Reporter
from specmac.cli.render import under_load
from specmac.tuning.timing import labelled

ADVISE_HELP = """What should I run? Without --draft: every configuration the installed backends can
run, ranked by predicted tokens/s within precision groups (each group one output distribution):
plain decoding of each target (none), prompt lookup (ngram, lookup), each draft model on each
backend and as a hybrid (LOOKUP+BACKEND, e.g. lookup+gguf), at K = 1..--k-max; `--k auto` in run
and serve chooses K every step from the same cost model. With --draft (ngram, lookup, a backend
or LOOKUP+BACKEND): S(K) of that one pairing for K = 1..16. Either ends with its first
choice as `specmac run` and `specmac serve` command lines.

\b
Ranking (models: .gguf files and/or Hugging Face folders; default the embedded pair):
  specmac advise -md draft.gguf -m target.gguf -m target-f16.gguf
One pairing:
  specmac advise --draft gguf --target torch -m FOLDER
"""


@main.command(help=ADVISE_HELP, short_help="What should I run here? Rank configurations, or one pairing.")
@click.option("--target", default=None, metavar="BACKEND",
              help="Target backend (one pairing with --draft; alone: only this backend's targets).")
@click.option("--draft", default=None, metavar="DRAFT",
              help="Advise on one pairing with this draft: ngram, lookup, a backend or LOOKUP+BACKEND "
                   "(none: the ranking).")
@click.option("-m", "--target-model", "target_models", multiple=True, metavar="PATH",
              help="Target model, repeatable for several precisions (.gguf file or HF folder).")
@click.option("-md", "--draft-model", "draft_models", multiple=True, metavar="PATH",
              help="Draft model, repeatable.")
@click.option("--target-opt", multiple=True, metavar="KEY=VALUE",
              help="Target backend option, repeatable (ranking: for every target variant).")
@click.option("--draft-opt", multiple=True, metavar="KEY=VALUE",
              help="Draft backend option, repeatable (ranking: for every draft variant).")
@ctx_option
@click.option("--backends", "backends_text", metavar="LIST",
              help="Ranking: backends to try, e.g. gguf,torch (default: every installed one).")
@click.option("--k-max", type=int, default=None, help="Ranking: largest K considered [default: 8].")
@sampling_options
@click.option("--prompt", "prompts", multiple=True,
              help="A text to measure acceptance on; repeat for several (default: the packaged workload "
                   "specmac:workload, prompts by category).")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Prompts as compare reads them: a .jsonl workload (Spec-Bench's shape: question_id, "
                   "category, turns), a .json list, or text with '---' lines between prompts; "
                   "specmac:workload is the packaged one. A workload's categories are each predicted.")
@click.option("--turns", type=click.Choice(["first", "all"]), default="first", show_default=True,
              help="Of a .jsonl workload's turns: the first user turn, or the whole conversation.")
@click.option("--chat/--no-chat", default=None,
              help="Apply the target's chat template to the prompts [default: with the packaged workload, "
                   "where the target has one; else no].")
@click.option("--by-category", is_flag=True,
              help="Ranking: the per-category table of every configuration (default: the top ones).")
@click.option("--run-tokens", type=int, default=48, show_default=True,
              help="Tokens generated per prompt to measure acceptance (ranking: its predictions are for "
              "runs this long, after a prompt like these: the draft's prefill of it counted once, the "
              "last step drafting only what is left to write).")
@click.option("--context", type=int, default=None,
              help="One pairing: tokens prefilled before each timing [default: 128].")
@click.option("--repeats", type=int, default=None, help="One pairing: timed repeats [default: 3].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False), help="One pairing: a PNG of the predicted S(K).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON record (with provenance).")
@click.option("--save", type=click.Path(dir_okay=False), metavar="FILE",
              help="Ranking: write a profile (the ranked configurations of each precision group, ready "
                   "to load) for `specmac serve --profile FILE`.")
@click.option("--export", metavar="ENGINE",
              help="Ranking: also print the launch command of the first choice in llama-server, vllm, sglang "
                   "or mlx-lm, and what that engine cannot express (docs/advise.md).")
def advise(target_models, draft_models, backends_text, k_max, prompts, prompts_path, turns, chat, by_category,
           run_tokens, context, repeats, as_json, plot, out, save, **kw):
    from specmac.cli.advise_workload import advise_prompts
    from specmac.cli.app import sampling_params
    from specmac.compare.results import code_measured

    code_measured()  # the commit as the run starts: what the record's provenance names
    ranking = kw["draft"] is None or kw["draft"] == "none"
    if kw["export"]:
        from specmac.advise.export import check_engine

        check_engine(kw["export"])
    _check_mode(ranking, {"--k-max": k_max, "--save": save, "--by-category": by_category or None,
                          "--export": kw["export"]},
                {"--plot": plot, "--context": context, "--repeats": repeats})
    k_max, context, repeats = k_max or 8, context or 128, repeats or 3
    if run_tokens < 2 or repeats < 1 or context < 1 or k_max < 1:
        raise UserError("--run-tokens must be >= 2, and --repeats, --context and --k-max >= 1")
    for flag, given in (("--target-model", target_models), ("--draft-model", draft_models)):
        twice = sorted({m for m in given if given.count(m) > 1})
        if twice:
            raise UserError(f"{flag} {twice[0]} is given twice: give each model once")
    backends = _backend_list(backends_text)
    params = sampling_params(kw)
    prompts, kw["chat"], kw["prompts_info"] = advise_prompts(prompts, prompts_path, turns, chat)
    with owned_outputs(out, plot), _saved_file(save, out):
        if ranking:
            if kw["ctx_size"] is not None:  # every variant's n_ctx, unless a --*-opt n_ctx says otherwise
                for flag in ("target_opt", "draft_opt"):
                    kw[flag] = (f"n_ctx={kw['ctx_size']}", *kw[flag])
            _rank(target_models, draft_models, backends, k_max, prompts, run_tokens, params, kw, as_json,
                  out, save, by_category)
            return
        for flag, given in (("--target-model", target_models), ("--draft-model", draft_models)):
            if len(given) > 1:
                raise UserError(f"{flag} is given {len(given)} times: one pairing takes one model per role "
                                "(drop --draft to rank several)")
        _one_pairing(dict(kw, target_model=next(iter(target_models), None),
                          draft_model=next(iter(draft_models), None)),
                     params, prompts, run_tokens, context, repeats, as_json, plot, out)


def _check_mode(ranking: bool, rank_only: dict, pairing_only: dict) -> None:
    """A flag of the other mode would be ignored: refuse it, naming the mode it belongs to."""
    for flag, value in (pairing_only if ranking else rank_only).items():
        if value is not None:
            mode = ("one pairing (with --draft BACKEND)" if ranking else "the ranking (without --draft)")
            raise UserError(f"{flag} applies only to {mode}: drop it, or "
                            + ("add --draft BACKEND" if ranking else "drop --draft"))


@contextlib.contextmanager
def _saved_file(save: str | None, out: str | None) -> Iterator[None]:
    """--save can be written (checked before anything is measured) and is this run's alone."""
    from specmac.compare.results import check_output
    from specmac.files import output_lock

    if save is None:
        yield
        return
    if out and os.path.abspath(out) == os.path.abspath(save):
        raise UserError(f"--save and --out are the same file ({save}): give the profile another name")
    check_output(save, "save")
    with output_lock(save, folder=False, param="--save"):
        yield


def _backend_list(text: str | None) -> list[str] | None:
    """--backends "gguf,torch" -> ["gguf", "torch"]; a list that names no backend is refused."""
    if text is None:
        return None
    names = [b.strip() for b in text.split(",")]
    if not all(names):
        raise UserError(f"--backends {text!r} has an empty name: write e.g. --backends gguf,torch")
    return list(dict.fromkeys(names))


def _rank(target_models, draft_models, backends, k_max, prompts, run_tokens, params, kw, as_json,
          out, save, by_category=False) -> None:
    from specmac.advise.rank import rank_configurations
    from specmac.compare.results import provenance

    if kw["target"]:
        backends = [kw["target"]] if backends is None else backends
    target_options = parse_kv(kw["target_opt"], "--target-opt")
    draft_options = parse_kv(kw["draft_opt"], "--draft-opt")
    # each probe said as it starts, how far it is and how long is left on stderr (--json too)
    with Reporter("") as report:
        record = under_load(lambda: rank_configurations(
            list(draft_models) or [None], list(target_models) or [None], params=params,
            prompts=prompts, backends=backends, chat=kw["chat"], k_max=k_max, run_tokens=run_tokens,
            seed=kw["seed"], target_options=target_options, draft_options=draft_options,
            notify=lambda m: report.say(f"probing {m}"), progress=labelled(report, "probing ")))
    record["prompts"] = kw["prompts_info"]
    record["provenance"] = provenance(" ".join(sys.argv), [*draft_models, *target_models])
    record["first_choice"] = _first_choice(record, kw["ctx_size"], save)
    if save:
        from specmac.advise.profile import save_profile

        save_profile(save, record)
    if kw["export"]:
        from specmac.advise.export import export_choice

        record["export"] = export_choice(record, kw["export"])
    report_record(record, out, None, as_json, lambda r: (_print_ranking(r, by_category), _print_export(r)))
    if save and not as_json:
        click.echo(f"\nprofile written to {save}: specmac serve --profile {save} [--precision GROUP]",
                   err=True)


def _first_choice(record: dict, ctx: int | None, save: str | None) -> dict:
    """The ranking's first choice (what `serve --profile` loads without --precision) as commands."""
    from specmac.advise.profile import build_profile, load_kwargs

    group = build_profile(record)["groups"][0]
    config = group["configurations"][0]
    commands = command_lines(load_kwargs(config), config["k"], ctx, record["sampling"])
    out = {"group": group["group"], **commands}
    if save:
        out["profile"] = shlex.join(["specmac", "serve", "--profile", save])
    return out


def _print_first_choice(first: dict) -> None:
    click.echo(f"\nfirst choice{' (' + first['group'] + ')' if first.get('group') else ''}, to copy:")
    for key in ("run", "serve", "profile"):
        if key in first:
            click.echo(f"  {first[key]}")


def _print_export(r: dict) -> None:
    from specmac.advise.export import export_lines

    for line in ["", *export_lines(r["export"])] if "export" in r else []:
        click.echo(line)


def _print_ranking(r: dict, by_category: bool = False) -> None:
    from specmac.cli.advise_workload import print_ranking_categories, prompts_line

    s = r["sampling"]
    how = "greedy" if s["temperature"] == 0 else f"T = {s['temperature']}"
    click.echo(f"{len(r['ranking'])} configurations of {len(r['targets'])} target and {len(r['drafts'])} "
               f"draft variants, measured in {r['seconds']:.0f} s ({how}; acceptance on "
               f"{r['reference']['tokens']} tokens of {r['reference']['prompts']} prompts)")
    click.echo(prompts_line(r))
    click.echo("Each group is one output distribution (the same weights in the same precision); speedup "
               "is over the group's fastest plain decoder.")
    names = [f"{e['draft_label']} \u2192 {e['target_label']}, K = {e['k']}" if e["k"]
             else f"plain {e['target_label']}" for e in r["ranking"]]
    width = max(map(len, names), default=0)
    group = None
    for e, name in zip(r["ranking"], names):
        if e["group"] != group:
            group = e["group"]
            click.echo(f"\n{group}")
        alpha = f"  \u03b1 {e['alpha']:.2f}" if e["alpha"] is not None else ""
        click.echo(f"{e['rank']:>4}  {name:<{width}} {e['predicted_tokens_per_second']:>9.1f} tok/s "
                   f"{e['predicted_speedup']:>6.2f}x{alpha}" + (f"  {e['reason']}" if e["reason"] else ""))
    print_ranking_categories(r, by_category)
    click.echo(f"\nlookup+MODEL (the hybrid) is {r['hybrid']}.")
    for sk in r["skipped"]:
        click.echo(f"skipped {sk['role']} {sk['backend']} {sk['precision']}: {sk['reason']}", err=True)
    _print_first_choice(r["first_choice"])


def _one_pairing(kw, params, prompts, run_tokens, context, repeats, as_json, plot, out) -> None:
    """Predict the speedup of one pairing for K = 1..16 from measured costs and acceptance."""
    from specmac.advise.pairing import advise_pair
    from specmac.compare.results import model_files, plot_speedup, provenance

    with Reporter("") as report:
        with report.waiting("loading the models"):
            pair = load_pair(kw)
        record = under_load(lambda: advise_pair(pair, params=params, prompts=prompts, run_tokens=run_tokens,
                                                context=context, repeats=repeats, seed=kw["seed"],
                                                chat=kw["chat"], progress=labelled(report, "probing ")))
    record["prompts"] = kw["prompts_info"]
    models = model_files(pair.target, kw["target_model"], "target")
    for backend in pair.drafts.values():
        models += model_files(backend, kw["draft_model"], "draft")
    record["provenance"] = provenance(" ".join(sys.argv), models)
    load = {"target": kw["target"], "target_model": kw["target_model"], "draft": kw["draft"],
            "draft_model": kw["draft_model"], "target_options": parse_kv(kw["target_opt"], "--target-opt"),
            "draft_options": parse_kv(kw["draft_opt"], "--draft-opt")}
    # speculation that does not pay: plain decoding is the first choice
    record["first_choice"] = command_lines(load, 0 if record["reasons"] else record["best_k"], kw["ctx_size"],
                                           params.to_dict())
    label = f"{kw['draft']} -> {kw['target']}"
    draw = plot and (lambda: plot_speedup([{"label": label, "table": record["table"]}], plot))
    report_record(record, out, draw, as_json, _print_advise)


def _print_advise(r: dict) -> None:
    from specmac.cli.advise_workload import print_pair_categories, prompts_line

    click.echo(prompts_line(r))
    click.echo(f"draft T(1) {r['t_draft_ms']:.2f} ms, target T(1) {r['t_target_ms']:.2f} ms, "
               f"c = {r['c']:.2f}; target \u03b2 = {r['beta']:.2f} ({r['verdict']}); "
               f"acceptance \u03b1 = {r['alpha']:.2f} over {r['acceptance_run']['n_tokens']} tokens "
               f"of {r['acceptance_run']['prompts']} prompts")
    click.echo(f"{'K':>3} {'tokens/pass':>12} {'speedup':>8}")
    for row in r["table"]:
        mark = "  <- best" if row["k"] == r["best_k"] else ""
        click.echo(f"{row['k']:>3} {row['tokens_per_pass']:>12.2f} {row['predicted_speedup']:>7.2f}x{mark}")
    if r["reasons"]:
        click.echo(f"speculation will not pay (best {r['predicted_speedup']:.2f}x at K = {r['best_k']}): "
                   + "; ".join(r["reasons"]))
    else:
        click.echo(f"best K = {r['best_k']}: predicted speedup {r['predicted_speedup']:.2f}x")
    if r.get("model_started") is False:
        click.echo("the hybrid's model does not pay here (its prefill and passes): predicted as its lookup "
                   "alone")
    print_pair_categories(r)
    _print_first_choice(r["first_choice"])
