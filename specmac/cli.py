"""The specmac command line: parse, call the library, render. User errors exit 2 in one line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from specmac.errors import SpecmacError

KINDS_STYLE = {"accepted": "green", "corrected": "red", "bonus": "cyan", "target": None}


class UserError(click.ClickException):
    exit_code = 2


class Group(click.Group):
    """Turns SpecmacError into a one-line message and exit status 2 (SPECMAC_DEBUG=1 re-raises)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpecmacError as e:
            if os.environ.get("SPECMAC_DEBUG") == "1":
                raise
            raise UserError(str(e)) from None


def _version_message() -> str:
    from specmac import __version__
    from specmac.backends import library_version

    libs = ("numpy", "mlx", "mlx-lm", "llama-cpp-python", "torch", "transformers")
    found = [f"{lib} {v}" for lib in libs if (v := library_version(lib))]
    return f"specmac {__version__} ({', '.join(found)})"


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=lambda ctx, _p, v: (click.echo(_version_message()), ctx.exit()) if v else None,
              help="Show the version of specmac and of every installed backend library.")
def main() -> None:
    """Speculative decoding across MLX, llama.cpp (GGUF) and PyTorch backends."""


# --- shared options ------------------------------------------------------------------------

def parse_kv(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} {item!r} is not key=value: write e.g. {flag} n_threads=2")
        out[key.strip()] = value.strip()
    return out


def pair_options(f: Callable) -> Callable:
    """--draft/--target, their models and their backend options."""
    opts = [
        click.option("--target", default="gguf", show_default=True, metavar="BACKEND",
                     help="Target backend (see `specmac backends`)."),
        click.option("--draft", default="none", show_default=True, metavar="BACKEND",
                     help="Draft backend, 'ngram' (prompt lookup) or 'none' (target only)."),
        click.option("--target-model", metavar="PATH|HUB_ID",
                     help="Target model: a folder, a .gguf file, a hub id or repo:file.gguf. "
                          "Default: the embedded tiny target."),
        click.option("--draft-model", metavar="PATH|HUB_ID", help="Draft model (as --target-model)."),
        click.option("--target-opt", multiple=True, metavar="KEY=VALUE",
                     help="Target backend option, repeatable (device, dtype, n_threads, ...)."),
        click.option("--draft-opt", multiple=True, metavar="KEY=VALUE",
                     help="Draft backend option, repeatable."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def sampling_options(f: Callable) -> Callable:
    opts = [
        click.option("--temperature", type=float, default=0.0, show_default=True,
                     help="0 is greedy."),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 is off."),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="1 is off."),
        click.option("--min-p", type=float, default=0.0, show_default=True, help="0 is off."),
        click.option("--seed", type=int, default=0, show_default=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def load_pair(kw: dict):
    from specmac.api import Pair

    return Pair.load(kw["target"], kw["draft"], target_model=kw["target_model"],
                     draft_model=kw["draft_model"],
                     target_options=parse_kv(kw["target_opt"], "--target-opt"),
                     draft_options=parse_kv(kw["draft_opt"], "--draft-opt"))


def sampling_params(kw: dict):
    from specmac.sampling import SamplingParams

    return SamplingParams(kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"])


def parse_k(value: str) -> int | str:
    """An integer >= 1, or "auto"."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise UserError(f"--k {value!r} is not a number: use an integer >= 1 or 'auto'") from None
    if k < 1:
        raise UserError(f"--k {k} is out of range: use an integer >= 1 or 'auto'")
    return k


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


# --- run ----------------------------------------------------------------------------------

@main.command()
@click.argument("prompt", required=False)
@pair_options
@sampling_options
@click.option("--k", "k_text", default="4", show_default=True, metavar="K|auto",
              help="Draft tokens per step, or 'auto' (adaptive, from the cost model).")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--prompt-file", type=click.Path(dir_okay=False), help="Read the prompt from a file.")
@click.option("--chat", is_flag=True, help="Apply the target's chat template, if it has one.")
@click.option("--baseline", is_flag=True, help="Also run target-only decoding and print the speedup.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--no-color", is_flag=True, help="No colour, even on a terminal.")
def run(prompt, k_text, max_tokens, prompt_file, chat, baseline, as_json, no_color, **kw):
    """Generate from PROMPT (or --prompt-file, or stdin) with speculative decoding."""
    from specmac import runner

    prompt = runner.read_prompt(prompt, prompt_file)
    if max_tokens < 1:
        raise UserError(f"--max-tokens {max_tokens} is out of range: use an integer >= 1")
    params = sampling_params(kw)
    k = parse_k(k_text)  # validated before any model loads
    pair = load_pair(kw)
    if k == "auto":
        from specmac.costmodel import AdaptiveK

        k = AdaptiveK.for_pair(pair)
    if chat:
        prompt = runner.apply_chat_template(pair.target, prompt)
    color = not no_color and not as_json and sys.stdout.isatty()
    code = runner.run(pair, prompt, params=params, k=k, max_tokens=max_tokens, seed=kw["seed"],
                      baseline=baseline, as_json=as_json, color=color,
                      meta={"command": " ".join(sys.argv)})
    sys.exit(code)


# --- verify -------------------------------------------------------------------------------

@main.command()
@pair_options
@sampling_options
@click.option("--k", "k_text", default="4", show_default=True, metavar="K")
@click.option("--tokens", type=int, default=4000, show_default=True,
              help="Tokens generated per method (speculative and target-only).")
@click.option("--length", type=int, default=3, show_default=True,
              help="Tokens per sample; a category is a whole sequence of this length.")
@click.option("--json", "as_json", is_flag=True)
def verify(k_text, tokens, length, as_json, **kw):
    """Is the output still the target's? Two-sample chi-square and greedy agreement."""
    from specmac import runner

    if tokens < length or length < 1:
        raise UserError("--tokens must be >= --length >= 1")
    if kw["draft"] == "none":
        raise UserError("verify needs a draft: add --draft BACKEND (or --draft ngram)")
    k = parse_k(k_text)
    if not isinstance(k, int):
        raise UserError("verify needs a fixed --k (an integer >= 1)")
    params = sampling_params(kw)
    pair = load_pair(kw)
    runner.verify(pair, params=params, k=k, tokens=tokens, length=length, seed=kw["seed"],
                  as_json=as_json)


# --- backends -----------------------------------------------------------------------------

@main.command()
@click.option("--json", "as_json", is_flag=True)
def backends(as_json):
    """List every registered backend: installed?, library version, devices."""
    from specmac import runner

    runner.list_backends(as_json)


def _register_extra_commands() -> None:
    """Commands in their own modules (probes, compare) attach themselves to ``main``."""
    import importlib

    for module in ("specmac.cli_probes", "specmac.cli_compare"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


_register_extra_commands()
