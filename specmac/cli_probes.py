"""`specmac probe-parallelism` and `specmac advise` (a ranking of configurations, or one pairing):
attached to the main group on import."""

from __future__ import annotations

import sys

import click

from specmac.cli import UserError, emit_json, load_pair, main, parse_kv, sampling_options


@main.command("probe-parallelism")
@click.option("--backend", "backend_name", required=True, metavar="BACKEND",
              help="Backend to probe (see `specmac backends`; plugins included).")
@click.option("--model", metavar="PATH|HUB_ID", help="Model (default: the embedded tiny target).")
@click.option("--opt", multiple=True, metavar="KEY=VALUE", help="Backend option, repeatable.")
@click.option("--role", type=click.Choice(["target", "draft"]), default="target", show_default=True,
              help="Which embedded model to load when --model is not given.")
@click.option("--n-max", type=int, default=16, show_default=True, help="Largest batch n probed.")
@click.option("--context", type=int, default=256, show_default=True,
              help="Tokens prefilled before every trial.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed repeats (after 1 warm-up).")
@click.option("--serial", is_flag=True, help="Serial control: batched scores run one token at a time.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of T(n).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON record (with provenance).")
def probe_parallelism_cmd(backend_name, model, opt, role, n_max, context, repeats, serial, as_json,
                          plot, out):
    """Does BACKEND verify n tokens in one parallel pass? Batched vs serial score timing."""
    from specmac.backends import load_backend
    from specmac.probes import SerialBackend, probe_parallelism
    from specmac.results import model_files, plot_parallelism, provenance

    if repeats < 1:
        raise UserError(f"--repeats {repeats} is out of range: use an integer >= 1")
    _check_outputs(out, plot)
    backend = load_backend(backend_name, model, parse_kv(opt, "--opt"), role=role)
    if serial:
        backend = SerialBackend(backend)
    record = probe_parallelism(backend, n_max=n_max, context=context, repeats=repeats)
    record["provenance"] = provenance(" ".join(sys.argv), model_files(backend, model, role))
    _report(record, out, plot and (lambda: plot_parallelism([record], plot)), as_json, _print_probe)


def _check_outputs(out: str | None, plot: str | None) -> None:
    """--out and --plot can be written: checked before anything is loaded or measured."""
    from specmac.results import check_output

    if out:
        check_output(out, "out")
    if plot:
        check_output(plot, "plot", image=True)


def _report(record: dict, out: str | None, draw, as_json: bool, show) -> None:
    """Write the record (--out) and the plot (--plot), then print it as JSON or as text."""
    from specmac.results import write_json

    if out:
        write_json(out, record)
    if draw:
        draw()
    if as_json:
        emit_json(record)
    else:
        show(record)


def _print_probe(r: dict) -> None:
    from specmac.probes.parallelism import NOISY

    click.echo(f"{r['backend']} {r['model']}{' (serial control)' if r['serial_control'] else ''}, "
               f"context {r['context']}, median of {r['repeats']}")
    click.echo(f"{'n':>3} {'batched ms':>11} {'serial ms':>10} {'serial/batched':>15}")
    for n, b, s in zip(r["n"], r["batched_ms"], r["serial_ms"]):
        click.echo(f"{n:>3} {b:>11.2f} {s:>10.2f} {s / b if b else float('nan'):>15.2f}")
    click.echo(f"fit T(n) = {r['t1_ms']:.2f} ms x (1 + {r['beta']:.2f} (n - 1)): {r['verdict']} "
               f"(parallel below \u03b2 = {r['thresholds']['parallel_below']}, serial from "
               f"{r['thresholds']['serial_from']})")
    click.echo(f"batched vs serial logits: max |\u0394| = {r['max_abs_logit_diff']:.3g}, "
               f"argmax flips {r['argmax_flips']} of {r['rows_compared']} rows")
    if r["relative_spread"] > NOISY:
        click.echo(f"warning: repeats vary by {r['relative_spread']:.0%} of the median (IQR): the "
                   "machine is busy; close other work or raise --repeats", err=True)


ADVISE_HELP = """What should I run? Without --draft: every configuration the installed backends can
run (draft backend and precision x target backend and precision x K, plain decoding of each target
included), ranked by predicted tokens/s within precision groups. With --draft BACKEND: S(K) of
that one pairing for K = 1..16.

\b
Ranking (models: .gguf files and/or Hugging Face folders; default the embedded pair):
  specmac advise --draft-model draft.gguf --target-model target.gguf --target-model target-f16.gguf
One pairing:
  specmac advise --draft gguf --target torch --target-model FOLDER
"""


@main.command(help=ADVISE_HELP, short_help="What should I run here? Rank configurations, or one pairing.")
@click.option("--target", default=None, metavar="BACKEND",
              help="Target backend (one pairing with --draft; alone: only this backend's targets).")
@click.option("--draft", default=None, metavar="BACKEND",
              help="Draft backend or ngram: advise on one pairing.")
@click.option("--target-model", "target_models", multiple=True, metavar="PATH",
              help="Target model, repeatable for several precisions (.gguf file or HF folder).")
@click.option("--draft-model", "draft_models", multiple=True, metavar="PATH", help="Draft model, repeatable.")
@click.option("--target-opt", multiple=True, metavar="KEY=VALUE",
              help="Target backend option, repeatable (ranking: for every target variant).")
@click.option("--draft-opt", multiple=True, metavar="KEY=VALUE",
              help="Draft backend option, repeatable (ranking: for every draft variant).")
@click.option("--backends", "backends_text", metavar="LIST",
              help="Ranking: backends to try, e.g. gguf,torch (default: every installed one).")
@click.option("--k-max", type=int, default=8, show_default=True, help="Ranking: largest K considered.")
@sampling_options
@click.option("--prompt", "prompts", multiple=True,
              help="A text to measure acceptance on; repeat for several (default: four of the "
                   "packaged prompts, code and prose).")
@click.option("--run-tokens", type=int, default=48, show_default=True,
              help="Tokens generated per prompt to measure acceptance (ranking: its predictions are for "
              "runs this long, after a prompt like these: the draft's prefill of it counted once, the "
              "last step drafting only what is left to write).")
@click.option("--context", type=int, default=128, show_default=True,
              help="One pairing: tokens prefilled before each timing.")
@click.option("--repeats", type=int, default=3, show_default=True, help="One pairing: timed repeats.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False), help="One pairing: a PNG of the predicted S(K).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON record (with provenance).")
def advise(target_models, draft_models, backends_text, k_max, prompts, run_tokens, context, repeats,
           as_json, plot, out, **kw):
    from specmac.cli import sampling_params

    if run_tokens < 2 or repeats < 1:
        raise UserError("--run-tokens must be >= 2 and --repeats >= 1")
    _check_outputs(out, plot)
    params = sampling_params(kw)
    if kw["draft"] is None or kw["draft"] == "none":
        _rank(target_models, draft_models, backends_text, k_max, prompts, run_tokens, params, kw, as_json,
              out)
        return
    for flag, given in (("--target-model", target_models), ("--draft-model", draft_models)):
        if len(given) > 1:
            raise UserError(f"{flag} is given {len(given)} times: one pairing takes one model per role "
                            "(drop --draft to rank several)")
    _one_pairing(dict(kw, target=kw["target"] or "gguf", target_model=next(iter(target_models), None),
                      draft_model=next(iter(draft_models), None)),
                 params, prompts, run_tokens, context, repeats, as_json, plot, out)


def _rank(target_models, draft_models, backends_text, k_max, prompts, run_tokens, params, kw, as_json,
          out) -> None:
    from specmac.advise_rank import rank_configurations
    from specmac.prompts import advise_prompts
    from specmac.results import provenance

    backends = [b.strip() for b in backends_text.split(",") if b.strip()] if backends_text else None
    if kw["target"]:
        backends = [kw["target"]] if backends is None else backends
    record = rank_configurations(list(draft_models) or [None], list(target_models) or [None],
                                 params=params, prompts=list(prompts) or advise_prompts(), backends=backends,
                                 k_max=k_max, run_tokens=run_tokens, seed=kw["seed"],
                                 target_options=parse_kv(kw["target_opt"], "--target-opt"),
                                 draft_options=parse_kv(kw["draft_opt"], "--draft-opt"),
                                 progress=None if as_json else lambda m: click.echo(f"probing {m}", err=True))
    record["provenance"] = provenance(" ".join(sys.argv), [*draft_models, *target_models])
    _report(record, out, None, as_json, _print_ranking)


def _print_ranking(r: dict) -> None:
    s = r["sampling"]
    how = "greedy" if s["temperature"] == 0 else f"T = {s['temperature']}"
    click.echo(f"{len(r['ranking'])} configurations of {len(r['targets'])} target and {len(r['drafts'])} "
               f"draft variants, measured in {r['seconds']:.0f} s ({how}; acceptance on "
               f"{r['reference']['tokens']} tokens of {r['reference']['prompts']} prompts)")
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
    for sk in r["skipped"]:
        click.echo(f"skipped {sk['role']} {sk['backend']} {sk['precision']}: {sk['reason']}", err=True)


def _one_pairing(kw, params, prompts, run_tokens, context, repeats, as_json, plot, out) -> None:
    """Predict the speedup of one pairing for K = 1..16 from measured costs and acceptance."""
    from specmac.advise import advise as run_advise
    from specmac.results import model_files, plot_speedup, provenance

    pair = load_pair(kw)
    record = run_advise(pair, params=params, prompts=list(prompts) or None,
                        run_tokens=run_tokens, context=context, repeats=repeats, seed=kw["seed"])
    models = model_files(pair.target, kw["target_model"], "target")
    if pair.drafter.backend is not None:
        models += model_files(pair.drafter.backend, kw["draft_model"], "draft")
    record["provenance"] = provenance(" ".join(sys.argv), models)
    label = f"{kw['draft']} -> {kw['target']}"
    _report(record, out, plot and (lambda: plot_speedup([{"label": label, "table": record["table"]}], plot)),
            as_json, _print_advise)


def _print_advise(r: dict) -> None:
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
