"""`specmac serve`: an OpenAI-compatible server over one pair (attached to the main group on import)."""

from __future__ import annotations

import json
import logging
import os
import sys

import click

from specmac.cli.app import UserError, load_pair, main, pair_options, parse_k
from specmac.cli.profile import profile_choice, profile_options
from specmac.cli.progress import Reporter


@main.command()
@pair_options
@profile_options
@click.option("--k", "k_text", default="auto", show_default=True, metavar="K|auto",
              help="Drafts per step unless a request says otherwise ({\"speculative\": {\"k\": ...}}).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback should have --api-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port (0: a free one, printed).")
@click.option("--queue-size", type=click.IntRange(min=1), default=16, show_default=True, metavar="N",
              help="Requests that may wait for the worker; more get 503 with Retry-After.")
@click.option("--parallel", "-np", type=click.IntRange(1, 64), default=4, show_default=True, metavar="N",
              help="requests generated at once, each pass serving them all (continuous batching); their "
                   "drafts share the pass's width. 1: one at a time")
@click.option("--cache-ram", type=click.IntRange(min=0), default=None, metavar="MIB",
              help="Memory for the caches of conversations not being served, so each next turn "
                   "processes only its new tokens [default: a quarter of the available memory, at most "
                   "8192]; 0 keeps only the conversation last served.")
@click.option("--cache-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Also keep, on disk, the caches the memory budget evicts (at most 16 GiB; entries name "
                   "the model files, options and library versions they came from; a server killed "
                   "mid-write leaves no half entry).")
@click.option("--api-key", envvar="SPECMAC_API_KEY", metavar="KEY",
              help="Require 'Authorization: Bearer KEY' (or set SPECMAC_API_KEY).")
@click.option("--model-name", metavar="NAME",
              help="The model id clients send (default: the target file's name).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def serve(k_text, host, port, queue_size, parallel, cache_ram, cache_dir, api_key, model_name, log_level,
          profile_path, precision, **kw):
    """Serve the pair over OpenAI's API: /v1/chat/completions, /v1/completions, /v1/models,
    /health and /metrics, with per-request "speculative" and "prediction" (Predicted Outputs).

    \b
    specmac serve --target gguf --target-model qwen-1.5b.gguf --draft gguf --draft-model qwen-0.5b.gguf
    curl -s localhost:8000/v1/chat/completions -d '{"model": "...", "messages": [...]}'
    specmac advise --save profile.json && specmac serve --profile profile.json --precision F16

    See docs/serve.md for the fields supported and refused. SIGTERM finishes the requests in
    flight, refuses new ones and exits 0.
    """
    try:
        from specmac.serve import server
    except ModuleNotFoundError as e:
        raise UserError(f"specmac serve needs {e.name}: pip install 'specmac[serve]'") from None

    k = parse_k(k_text)
    choice = profile_choice(profile_path, precision, kw, k_text)  # checked before anything loads
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty: give a key, or leave it (and SPECMAC_API_KEY) unset")
    logging.basicConfig(level=getattr(logging, log_level.upper()), format="%(levelname)-9s %(message)s")
    try:
        sock = server.bind(host, port)
    except OSError as e:
        raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}): "
                        "choose another port, or --port 0 for a free one") from None
    k = choice.k if choice else k
    with Reporter("specmac serve") as report:  # the waits before the URL: loading, measuring
        pair, planner = _load(report, choice, kw, k, cache_ram, cache_dir)
    name = model_name or server.model_name(pair)
    config = {"k": k, **pair.info()}
    if k == "auto":
        config["k_policy"] = {"calibrated": planner.costs.measured > 0}
    actual = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"specmac serve: http://{shown}:{actual}/v1  model {name!r}", err=True)
    click.echo(f"  target {_label(config['target'])}  draft {_label(config['draft'])}  k={k}", err=True)
    if choice:
        click.echo(f"  {choice.line}", err=True)
    if not server.is_loopback(host) and not api_key:
        click.secho(f"WARNING: listening on {host}, beyond this machine, with no API key: anyone who can "
                    "reach this port can use the model. Add --api-key KEY (or SPECMAC_API_KEY).",
                    err=True, fg="red", bold=True)
    if os.environ.get("SPECMAC_DEBUG") == "1":
        click.echo(json.dumps(config, default=str), err=True)
    sys.exit(server.serve(pair, sock, k=k, queue_size=queue_size, api_key=api_key, model_id=name,
                          config=_public(config), log_level=log_level, planner=planner, parallel=parallel))


def _load(report: Reporter, choice, kw: dict, k, cache_ram: int | None, cache_dir: str | None):
    """-> (the pair, loaded with its caches' store, and its planner)."""
    with report.waiting("loading the models"):
        pair = choice.pair() if choice else load_pair(kw)
    from specmac.store import SequenceStore, default_budget
    from specmac.store.disk import DISK_BUDGET, DiskTier

    budget = default_budget() if cache_ram is None else cache_ram << 20
    disk = None
    if cache_dir:
        try:
            disk = DiskTier(cache_dir, {"target": pair.target, **pair.drafts}, DISK_BUDGET)
        except OSError as e:
            raise UserError(f"--cache-dir {cache_dir}: cannot keep caches there ({e.strerror or e}): give a "
                            "writable folder") from None
    pair.store = SequenceStore(budget, disk) if budget or disk else None
    # "auto" measures the pass costs now (kept on disk), not in the first request
    return pair, pair.planner(k, notify=report.say, progress=report)


def _label(info: dict) -> str:
    if "backend" not in info:
        return info.get("drafter", "none")
    return f"{info['backend']}:{info.get('model')}"


def _public(config: dict) -> dict:
    """What /v1/models shows: backends and models, not local file paths or vocabularies."""
    def strip(d: dict) -> dict:
        return {k: v for k, v in d.items() if k in ("backend", "model", "library", "library_version", "n_ctx",
                                                     "drafter")}
    return {"k": config["k"], "target": strip(config["target"]), "draft": strip(config["draft"])}
