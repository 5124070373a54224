"""`specmac probe-parallelism` and `specmac advise`: attached to the main group on import."""

from __future__ import annotations

import sys

import click

from specmac.cli import UserError, emit_json, load_pair, main, pair_options, parse_kv, sampling_options


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
    backend = load_backend(backend_name, model, parse_kv(opt, "--opt"), role=role)
    if serial:
        backend = SerialBackend(backend)
    record = probe_parallelism(backend, n_max=n_max, context=context, repeats=repeats)
    record["provenance"] = provenance(" ".join(sys.argv), model_files(backend, model, role))
    _report(record, out, plot and (lambda: plot_parallelism([record], plot)), as_json, _print_probe)


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


@main.command()
@pair_options
@sampling_options
@click.option("--prompt", "prompts", multiple=True,
              help="A text to measure acceptance on; repeat for several (default: four of the "
                   "packaged prompts, code and prose).")
@click.option("--run-tokens", type=int, default=48, show_default=True,
              help="Tokens generated per prompt to measure acceptance.")
@click.option("--context", type=int, default=128, show_default=True,
              help="Tokens prefilled before each timing.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of the predicted S(K).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON record (with provenance).")
def advise(prompts, run_tokens, context, repeats, as_json, plot, out, **kw):
    """Predict the speedup of speculation for K = 1..16 from measured costs and acceptance."""
    from specmac.advise import advise as run_advise
    from specmac.cli import sampling_params
    from specmac.results import model_files, plot_speedup, provenance

    if kw["draft"] == "none":
        raise UserError("advise needs a draft: add --draft BACKEND (or --draft ngram)")
    if run_tokens < 2 or repeats < 1:
        raise UserError("--run-tokens must be >= 2 and --repeats >= 1")
    pair = load_pair(kw)
    record = run_advise(pair, params=sampling_params(kw), prompts=list(prompts) or None,
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
