"""`specmac probe-parallelism`: attached to the main group on import."""

from __future__ import annotations

import sys

import click

from specmac.cli.app import UserError, main, owned_outputs, parse_kv, report_record
from specmac.cli.render import under_load


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
    from specmac.compare.results import code_measured, model_files, plot_parallelism, provenance
    from specmac.probes import SerialBackend, probe_parallelism

    code_measured()  # the commit as the run starts: what the record's provenance names

    if repeats < 1:
        raise UserError(f"--repeats {repeats} is out of range: use an integer >= 1")
    with owned_outputs(out, plot):
        backend = load_backend(backend_name, model, parse_kv(opt, "--opt"), role=role)
        if serial:
            backend = SerialBackend(backend)
        record = under_load(lambda: probe_parallelism(backend, n_max=n_max, context=context,
                                                      repeats=repeats))
        record["provenance"] = provenance(" ".join(sys.argv), model_files(backend, model, role))
        report_record(record, out, plot and (lambda: plot_parallelism([record], plot)), as_json,
                      _print_probe)


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
