"""``specmac compare`` and ``specmac report``: which draft/target pairing to run on this machine."""

from __future__ import annotations

import contextlib
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import click
from click.core import ParameterSource

from specmac.cli.app import UserError, emit_json, main, one_line, sampling_options, sampling_params
from specmac.cli.flags import ctx_option, model_backend
from specmac.files import machine_lock, output_lock

COMPARE_HELP = """Measure draft/target pairings side by side: every --pair at every K, plus each
target's own plain decoding (none), interleaved in one run, with the cost model's prediction
beside each measurement. Writes DIR/results.json, DIR/summary.md and PNG plots. A pair's draft is
a backend (a draft model), ngram or lookup (prompt lookup) or LOOKUP+BACKEND (a hybrid, e.g.
lookup+gguf); K is a list of widths and/or auto (chosen every step, as `run --k auto`).

\b
Models as run and advise take them (default: the embedded tiny pair):
  specmac compare -md draft.gguf -m target.gguf    (pairs gguf:gguf and ngram:gguf)
  specmac compare --pair lookup+gguf:gguf -md draft.gguf -m target.gguf --k 2,4,auto
or per backend, with options per backend:
  --draft-model mlx=FOLDER  --target-model gguf=FILE.gguf
  --opt gguf:n_threads=2  (both roles)   --draft-opt torch:dtype=float32   -c 4096 (every n_ctx)
or a TOML --config with one table per backend:
  [gguf]
  target_model = "$SPECMAC_MODELS/target.gguf"
  draft_model = "draft.gguf"
  options = { n_threads = 2 }
  draft_options = { quant = "q8_0" }
and, in a [compare] table, any flag below (a suite: one measurement, re-run on any machine):
  [compare]
  pairs = ["gguf:gguf", "ngram:gguf"]
  k = "1-8"
  out = "my-suite/{machine}"
Command-line values win over the config.

\b
Example:
  specmac compare --pair mlx:gguf --pair ngram:gguf --k 1-8 --repeats 3 --out cmp
  specmac compare --config my-suite.toml --exclusive
"""


def _backend_kv(values: tuple[str, ...], flag: str) -> tuple[dict[str, str], str | None]:
    """("mlx=PATH", "FILE.gguf") -> ({"mlx": "PATH"}, "FILE.gguf"): models of one backend each, and
    at most one model as run takes it (a path that exists is a path, "=" or not)."""
    from specmac.backends import registry

    out, plain = {}, None
    for item in values:
        name, sep, value = item.partition("=")
        if Path(item).expanduser().exists() or not (sep or item in registry()):
            if plain is not None:
                raise UserError(f"{flag} is given twice as a path ({plain}, {item}): give one, or "
                                f"BACKEND=PATH per backend, e.g. {flag} gguf=model.gguf")
            plain = item
            continue
        if not sep or not name.strip() or not value.strip() or "/" in name:
            raise UserError(f"{flag} {item!r} is not PATH or BACKEND=PATH: write e.g. {flag} model.gguf "
                            f"or {flag} gguf=model.gguf")
        out[name.strip()] = value.strip()
    return out, plain


def _pair_models(kw: dict, pairs: tuple[str, ...]) -> tuple[dict[str, dict[str, str]], tuple[str, ...]]:
    """-> ({"draft": {backend: path}, "target": {...}}, the pairs). A model given as run takes it is
    the model of every pair's backend in its role; with no --pair, the pairs are run's: the draft
    model's backend and ngram, each in front of the target model's backend (``model_backend``)."""
    from specmac.compare import measure as cmp
    from specmac.core.sources import FREE

    (drafts, draft), (targets, target) = (_backend_kv(kw["draft_model"], "--draft-model"),
                                          _backend_kv(kw["target_model"], "--target-model"))
    if (draft or target) and not pairs:
        t = model_backend(target) if target else "gguf"
        pairs = ((f"{model_backend(draft)}:{t}",) if draft else ()) + (f"ngram:{t}",)
    for spec in cmp.parse_pairs(pairs) if draft or target else ():
        if target:
            targets.setdefault(spec.target, target)
        if draft and spec.draft_backend not in FREE:
            drafts.setdefault(spec.draft_backend, draft)
    return {"draft": drafts, "target": targets}, pairs


def _ctx_opts(pairs: tuple[str, ...], ctx: int | None) -> list[tuple[str, str, str]]:
    """-c: n_ctx of every model backend the pairs use, both roles (--opt and --*-opt win)."""
    from specmac.compare import measure as cmp
    from specmac.core.sources import FREE

    if ctx is None:
        return []
    used = {b for p in cmp.parse_pairs(pairs) for b in (p.target, p.draft_backend) if b not in FREE}
    return [(b, "n_ctx", str(ctx)) for b in sorted(used)]


def _backend_opts(values: tuple[str, ...], flag: str) -> list[tuple[str, str, str]]:
    """("gguf:n_threads=2", ...) -> [("gguf", "n_threads", "2")]."""
    out = []
    for item in values:
        name, _, kv = item.partition(":")
        key, sep, value = kv.partition("=")
        if not name or not sep or not key:
            raise UserError(f"{flag} {item!r} is not BACKEND:KEY=VALUE: write e.g. {flag} gguf:n_threads=2")
        out.append((name.strip(), key.strip(), value.strip()))
    return out


def _default_out() -> str:
    return "specmac-compare-" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")


@main.command(help=COMPARE_HELP, short_help="Which pairing should I run here? Measure them all.")
@click.option("--pair", "pairs", multiple=True, metavar="DRAFT:TARGET",
              help="A pairing, repeatable: DRAFT (a backend, ngram, lookup or LOOKUP+BACKEND) : target "
                   "backend. Default: with -m/-md, run's pair and ngram; else every combination of the "
                   "installed backends, plus ngram.")
@click.option("--k", "k_text", default="1,2,4,6,8", show_default=True, metavar="LIST",
              help="K values: a comma list and/or ranges, and/or auto, e.g. 1,2,4 or 1-8,auto.")
@click.option("-md", "--draft-model", multiple=True, metavar="[BACKEND=]PATH",
              help="Draft model, as run takes it (the draft of every pair with a draft model; without "
                   "--pair it makes the pairs), or BACKEND=PATH: that backend's draft model.")
@click.option("-m", "--target-model", multiple=True, metavar="[BACKEND=]PATH",
              help="Target model, as run takes it (the target of every pair), or BACKEND=PATH: that "
                   "backend's target model.")
@ctx_option
@click.option("--opt", multiple=True, metavar="BACKEND:KEY=VALUE", help="Backend option, both roles.")
@click.option("--draft-opt", multiple=True, metavar="BACKEND:KEY=VALUE", help="Option of a draft backend.")
@click.option("--target-opt", multiple=True, metavar="BACKEND:KEY=VALUE", help="Option of a target backend.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="FILE.toml",
              help="Models and options per backend, and any flag in a [compare] table (see above).")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="A .json list of prompts, a .jsonl workload (Spec-Bench's shape: question_id, "
                   "category, turns), or text with prompts separated by '---' lines; specmac:workload "
                   "is the packaged workload (prompts by category). Default: the shipped set (12 code "
                   "and prose prompts).")
@click.option("--turns", type=click.Choice(["first", "all"]), default="first", show_default=True,
              help="Of a .jsonl workload's turns: the first user turn, or the whole conversation.")
@click.option("--chat", is_flag=True, help="Apply each target's chat template to the prompts.")
@click.option("--categories", metavar="LIST", help="Only the prompts of these categories (comma list).")
@click.option("--per-category", type=int, metavar="N", help="Only the first N prompts of each category.")
@click.option("--n-prompts", type=int, help="Use only the first N prompts.")
@click.option("-n", "--max-tokens", type=int, default=64, show_default=True, help="New tokens per run.")
@click.option("--max-tokens-for", multiple=True, metavar="CATEGORY=N",
              help="New tokens per run for the prompts of one category, repeatable.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Rounds over every prompt.")
@click.option("--warmup-tokens", type=int, default=8, show_default=True,
              help="Tokens of the discarded warm-up run of each configuration.")
@sampling_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Output folder; {machine} in it is this machine's short name (its CPU family and "
                   "widest vector extension, or $SPECMAC_MACHINE when set). Default: "
                   "./specmac-compare-<UTC time>.")
@click.option("--exclusive", is_flag=True,
              help="Wait until no other specmac benchmark runs on this machine, and hold it (a lock "
                   "in the temporary folder): two that share the CPUs measure each other.")
@click.option("--endpoint", "endpoints", multiple=True, metavar="[LABEL=]URL",
              help="An OpenAI-compatible server (its /v1 URL; URL#MODEL picks a model) measured on the same "
                   "prompts, repeatable; alone, or beside local --pair configurations. API keys from "
                   "SPECMAC_ENDPOINT_KEY_<LABEL> or SPECMAC_ENDPOINT_KEY (docs/serve.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the results record as JSON.")
def compare(config_path, as_json, **kw):
    from specmac.cli import compare_endpoints
    from specmac.compare import measure as cmp
    from specmac.compare import prompts, report, suite
    from specmac.compare.results import check_output

    endpoints = compare_endpoints.parse(kw["endpoints"])
    config, backend_tables = suite.split(cmp.read_config(config_path)) if config_path else ({}, None)
    _from_config(click.get_current_context(), kw, suite.flag_values(config))
    pairs = kw["pairs"]
    if kw["max_tokens"] < 1 or kw["repeats"] < 1 or kw["warmup_tokens"] < 1:
        raise UserError("--max-tokens, --repeats and --warmup-tokens must be integers >= 1")
    categories = [c.strip() for c in kw["categories"].split(",")] if kw["categories"] else None
    tokens_for = _max_tokens_for(kw["max_tokens_for"])
    models, pairs = _pair_models(kw, pairs)
    chosen = prompts.select(prompts.read_prompts(kw["prompts_path"], None, kw["turns"]), categories,
                            kw["per_category"], tokens_for)
    settings = cmp.Settings(
        pairs=cmp.parse_pairs(pairs) if pairs or not endpoints else [], ks=cmp.parse_ks(kw["k_text"]),
        skip_unpairable=not pairs or "all" in pairs,
        prompts=prompts.first(chosen, kw["n_prompts"]), params=sampling_params(kw),
        chat=kw["chat"], max_tokens=kw["max_tokens"], repeats=kw["repeats"], seed=kw["seed"],
        warmup_tokens=kw["warmup_tokens"], max_tokens_for=tokens_for,
        backends=cmp.backend_settings(
            suite.expand_models(backend_tables) if backend_tables is not None else None,
            draft_model=models["draft"], target_model=models["target"],
            opts=_ctx_opts(pairs, kw["ctx_size"]) + _backend_opts(kw["opt"], "--opt"),
            draft_opts=_backend_opts(kw["draft_opt"], "--draft-opt"),
            target_opts=_backend_opts(kw["target_opt"], "--target-opt")))
    out = Path(suite.out_folder(kw["out_dir"]) if kw["out_dir"] else _default_out())
    check_output(out, "out", folder=True)  # before anything is loaded or measured
    compare_endpoints.connect(endpoints)  # every server reached before the folder is made
    command = shlex.join(["specmac", *sys.argv[1:]])
    with output_lock(out, folder=True, command=command):  # one run per folder (a second is refused)
        check_not_complete(out)
        with machine_lock(_waiting, command=command) if kw["exclusive"] else contextlib.nullcontext():
            code = _compare_into(out, cmp, report, settings, command, as_json, endpoints)
    if code:
        sys.exit(code)


# a key of the config's [compare] table -> the name of the parameter of its flag
_PARAM_OF = {"pairs": "pairs", "k": "k_text", "prompts": "prompts_path", "out": "out_dir"}


def _from_config(ctx: click.Context, kw: dict, values: dict) -> None:
    """The [compare] table's value of every flag the command line did not give, checked as the
    flag's own value would be."""
    params = {p.name: p for p in ctx.command.params}
    for key, value in values.items():
        name = _PARAM_OF.get(key, key)
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            continue
        try:
            kw[name] = params[name].type_cast_value(ctx, value)
        except click.BadParameter as e:
            raise UserError(f"--config [compare] {key} = {value!r}: {one_line(e.format_message())}") from None


def _max_tokens_for(values: tuple[str, ...]) -> dict[str, int]:
    """("code_editing=256", ...) -> {"code_editing": 256}."""
    out = {}
    for item in values:
        cat, sep, n = item.partition("=")
        try:
            out[cat.strip()] = int(n)
        except ValueError:
            raise UserError(f"--max-tokens-for {item!r} is not CATEGORY=N: write e.g. --max-tokens-for "
                            "code_editing=256") from None
        if not sep or not cat.strip():
            raise UserError(f"--max-tokens-for {item!r} is not CATEGORY=N: write e.g. --max-tokens-for "
                            "code_editing=256")
    return out


def _waiting(holder: str) -> None:
    click.echo(f"compare: waiting for another benchmark on this machine to end ({holder})", err=True)


def check_not_complete(out: Path) -> None:
    """Refuse to overwrite the complete record of an earlier run (one that stopped early is redone)."""
    try:
        old = json.loads((out / "results.json").read_text("utf-8"))
    except (OSError, ValueError, RecursionError):  # not a record: nothing to keep from overwriting
        return
    if isinstance(old, dict) and old.get("complete") is True:
        prov = old.get("provenance") if isinstance(old.get("provenance"), dict) else {}
        raise UserError(f"--out {out} already holds the complete record of another run "
                        f"({prov.get('command') or 'specmac compare'}, {prov.get('utc') or 'time unknown'}): "
                        "give another --out, or delete its results.json to measure again")


def _compare_into(out: Path, cmp, report, settings, command: str, as_json: bool, endpoints=()) -> int:
    """Measure, write results.json (the rounds so far as they complete, then the whole record),
    summary.md and the plots into ``out``, and print the headline; -> the exit status."""
    from specmac.cli import compare_endpoints
    from specmac.compare.results import write_json

    save = lambda rec: write_json(out / "results.json", rec)  # noqa: E731
    record = None
    if settings.pairs:
        n_spec = len(settings.pairs) * len(settings.ks)
        click.echo(f"{len(settings.pairs)} pairings x {len(settings.ks)} K + "
                   f"{len(settings.configs()) - n_spec} baselines, {len(settings.prompts)} prompts x "
                   f"{settings.repeats} repeats", err=True)
        # results.json holds the rounds measured so far ("complete": false) until the run ends
        record = _run_with_progress(cmp, settings, command, save)
    if endpoints and not (record and record["interrupted"]):
        record = compare_endpoints.measure(record, settings, endpoints, command, save, PlainProgress)
    write_json(out / "results.json", record)
    written = report.render(record, out)
    if skipped := report.skipped_line(record):  # the header counted them in: say they were not measured
        click.echo(skipped, err=True)
    if as_json:
        emit_json(record)
        return 0
    click.echo(report.headline(record).replace("**", ""))
    click.echo(f"wrote {out / 'results.json'}, " + ", ".join(str(p) for p in written), err=True)
    return 130 if record["interrupted"] else 0


def _run_with_progress(cmp, settings, command: str, checkpoint) -> dict:
    """run_compare with a rich progress bar (with an ETA) on stderr when it is a terminal, else
    plain lines: each phase, and as many progress lines as there are configurations."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
        lines = PlainProgress(settings.n_runs(), len(settings.configs()))
        return cmp.run_compare(settings, command=command, progress=lines.tick, status=lines.status,
                               checkpoint=checkpoint)
    columns = (TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("loading models", total=settings.n_runs())

        def tick(desc: str) -> None:
            bar.update(task, advance=1, description=desc[:36])

        return cmp.run_compare(settings, command=command, progress=tick,
                               status=lambda desc: bar.update(task, description=desc[:36]),
                               checkpoint=checkpoint)


class PlainProgress:
    """Progress for logs and pipes: one line per phase, and ``n_lines`` evenly spaced lines over
    ``total`` generations (done/total, elapsed, ETA, the last generation)."""

    def __init__(self, total: int, n_lines: int) -> None:
        self.total, self.n_lines, self.done, self.next_line = total, max(1, n_lines), 0, 1
        self.start, self.phases = time.monotonic(), 0

    def status(self, desc: str) -> None:
        # the first phase (loading) follows compare's own header line: a model that cannot be
        # loaded stays a one-line error below it
        if self.phases:
            click.echo(f"compare: {desc}", err=True)
        self.phases += 1

    def tick(self, desc: str) -> None:
        self.done += 1
        if self.done * self.n_lines < self.next_line * self.total:
            return
        self.next_line = self.done * self.n_lines // self.total + 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        click.echo(f"compare: {self.done}/{self.total} generations ({100 * self.done / self.total:.0f}%), "
                   f"{_clock(elapsed)} elapsed, ETA {_clock(eta)}  [{desc}]", err=True)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write the summary and plots here instead of into DIRECTORY.")
@click.option("--json", "as_json", is_flag=True, help="Print the headline and the files written as JSON.")
def report(directory, out_dir, as_json):
    """Re-render summary.md and the plots of a compare run from its results.json (no re-run)."""
    from specmac.compare import report as rep
    from specmac.compare.results import check_output

    check_output(out_dir or directory, "out", folder=True)
    with output_lock(out_dir or directory, folder=True):  # not while a compare writes there
        record = rep.load_record(directory)
        written = rep.render(record, out_dir or directory)
    if as_json:
        emit_json({"headline": rep.headline(record), "files": [str(p) for p in written]})
        return
    if skipped := rep.skipped_line(record):
        click.echo(skipped, err=True)
    click.echo(rep.headline(record).replace("**", ""))
    click.echo("wrote " + ", ".join(str(p) for p in written), err=True)
