"""The flags that name a pair: -m/--target-model, -md/--draft-model, --target, --draft, their
--*-opt and -c/--ctx-size, shared by run, verify and serve (advise and compare take the same model
flags). Checked before any weights load; a model alone implies its backend, as llama.cpp's -m/-md do.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import click

from specmac.cli.base import UserError, one_line, parse_kv
from specmac.errors import SpecmacError, VocabMismatch

DRAFTERS_WITHOUT_MODEL = ("none", "ngram", "lookup")
CTX_FLAG = "-c/--ctx-size"
BACKEND_RULE = ("gguf for a .gguf file, torch for a Hugging Face folder or hub id (mlx for a folder of "
                "mlx-lm's quantised weights)")


def model_backend(model: str) -> str:
    """The backend that loads ``model`` as it is, with no conversion: gguf for a .gguf file (or
    repo_id:file.gguf, or any file), else torch (a Hugging Face folder or hub id), or mlx for a folder
    of mlx-lm's quantised weights (a "quantization" entry in its config.json: only mlx loads them)."""
    path = Path(model).expanduser()
    if model.lower().endswith(".gguf") or path.is_file():
        return "gguf"
    try:
        config = json.loads((path / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return "torch"
    return "mlx" if isinstance(config, dict) and isinstance(config.get("quantization"), dict) else "torch"


def ctx_option(f: Callable) -> Callable:
    return click.option("-c", "--ctx-size", type=click.IntRange(min=2), default=None, metavar="N",
                        help="Context window in tokens of the target and the draft model (each backend's "
                             "n_ctx option; a --target-opt/--draft-opt n_ctx wins for its role) "
                             "[default: each backend's, 2048 for gguf].")(f)


def resolve_backends(kw: dict) -> None:
    """--target and --draft where the command line left them out: the draft's from -md (none
    without it), the target's from -m (gguf without it, the embedded target)."""
    if kw.get("target") is None:
        kw["target"] = model_backend(kw["target_model"]) if kw.get("target_model") else "gguf"
    if kw.get("draft") is None:
        kw["draft"] = model_backend(kw["draft_model"]) if kw.get("draft_model") else "none"


def pair_options(f: Callable) -> Callable:
    """--target/--draft, their models, their backend options and -c; the command gets --target and
    --draft resolved (``resolve_backends``) before its body runs."""
    @functools.wraps(f)
    def resolved(*args, **kw):
        resolve_backends(kw)
        return f(*args, **kw)

    opts = [
        click.option("--target", default=None, metavar="BACKEND",
                     help=f"Target backend (see `specmac backends`) [default: from -m: {BACKEND_RULE}; "
                          "gguf without -m]."),
        click.option("--draft", default=None, metavar="BACKEND",
                     help="Draft: a backend, 'lookup' or 'ngram' (prompt lookup), LOOKUP+BACKEND (a "
                          "hybrid, e.g. lookup+gguf: lookup where it matches well, else the model) "
                          "or 'none' (plain) [default: from -md as for --target; none without -md]."),
        click.option("-m", "--target-model", metavar="PATH|HUB_ID",
                     help="Target model: a folder, a .gguf file, a hub id (org/name) or "
                          "org/name:file.gguf. Default: the embedded tiny target."),
        click.option("-md", "--draft-model", metavar="PATH|HUB_ID",
                     help="Draft model (as -m); alone it implies --draft (a .gguf: gguf)."),
        click.option("--target-opt", multiple=True, metavar="KEY=VALUE",
                     help="Target backend option, repeatable (device, dtype, n_threads, ...; "
                          "`specmac backends --options` lists them)."),
        click.option("--draft-opt", multiple=True, metavar="KEY=VALUE",
                     help="Draft backend option, repeatable."),
        ctx_option,
    ]
    for o in reversed(opts):
        resolved = o(resolved)
    return resolved


def check_backend_name(name: str, flag: str, extra: tuple[str, ...] = ()) -> None:
    """Fail before any model loads when a backend name is unknown."""
    from specmac.backends import registry

    known = list(registry())
    if name not in known and name not in extra:
        raise UserError(f"{flag} {name!r} is not a backend; choose one of: "
                        f"{', '.join(sorted(known) + list(extra))} (see `specmac backends`)")


def check_backend_options(name: str, raw: dict[str, str], flag: str) -> None:
    """Parse ``--*-opt`` values against the backend's declared options, naming the flag on error."""
    from specmac.backends import backend_class

    cls = backend_class(name)
    try:
        cls.parse_options(raw)
    except SpecmacError as e:
        raise UserError(f"{flag}: {one_line(str(e))}") from None


def with_ctx(backend: str, options: dict, ctx: int | None) -> dict:
    """``options`` with n_ctx = ctx (-c) unless they set it; a backend without n_ctx is refused."""
    from specmac.backends import backend_class

    if ctx is None or "n_ctx" in options:
        return options
    option = backend_class(backend).options.get("n_ctx")
    if option is None:
        raise UserError(f"{CTX_FLAG} {ctx}: the {backend} backend has no context window option (n_ctx): "
                        f"drop {CTX_FLAG}")
    try:
        option.parse("n_ctx", str(ctx))
    except SpecmacError as e:
        raise UserError(f"{CTX_FLAG} {ctx}: {one_line(str(e))}") from None
    return {**options, "n_ctx": str(ctx)}


def load_pair(kw: dict):
    """Check names and options (cheap, before any weights load), then load the Pair. Where one
    model is given and the other role falls back to the embedded tiny model, say so (one line)."""
    from specmac.api import Pair
    from specmac.core.sources import split_draft

    resolve_backends(kw)
    check_backend_name(kw["target"], "--target")
    try:
        parts = split_draft(kw["draft"])
    except SpecmacError as e:
        raise UserError("--" + one_line(str(e))) from None
    hybrid = len(parts) == 2
    draft_backend = parts[-1] if parts else kw["draft"]
    check_backend_name(draft_backend, "--draft", () if hybrid else DRAFTERS_WITHOUT_MODEL)
    ctx = kw.get("ctx_size")
    target_opts = with_ctx(kw["target"], parse_kv(kw["target_opt"], "--target-opt"), ctx)
    draft_opts = parse_kv(kw["draft_opt"], "--draft-opt")
    check_backend_options(kw["target"], target_opts, "--target-opt")
    model_draft = draft_backend not in DRAFTERS_WITHOUT_MODEL
    if model_draft:
        draft_opts = with_ctx(draft_backend, draft_opts, ctx)
        check_backend_options(draft_backend, draft_opts, "--draft-opt")
    fallback = _fallback(kw, draft_backend) if model_draft else None
    try:
        pair = Pair.load(kw["target"], kw["draft"], target_model=kw["target_model"],
                         draft_model=kw["draft_model"], target_options=target_opts,
                         draft_options=draft_opts)
    except VocabMismatch as e:
        if fallback is None:
            raise
        given, missing, flag = fallback
        raise UserError(f"the {given} model and the embedded tiny {missing} have different tokenizers "
                        f"(no {flag}): add {flag} with a model of the {given}'s family") from e
    except SpecmacError as e:
        msg = one_line(str(e))
        if ctx is not None and f"n_ctx={ctx} " in msg:
            raise UserError(f"{CTX_FLAG} {ctx}: {msg}") from None
        raise
    if fallback is not None:
        click.echo(f"specmac: no {fallback[2]}: the {fallback[1]} is the embedded tiny {fallback[1]} model",
                   err=True)
    return pair


def _fallback(kw: dict, draft_backend: str) -> tuple[str, str, str] | None:
    """(the role given a model, the role without one, its flag) where exactly one model is given
    and the other role loads the embedded tiny model; else None."""
    embedded = {"target": kw["target"] != "synthetic", "draft": draft_backend != "synthetic"}
    if kw["target_model"] and not kw["draft_model"] and embedded["draft"]:
        return "target", "draft", "-md/--draft-model"
    if kw["draft_model"] and not kw["target_model"] and embedded["target"]:
        return "draft", "target", "-m/--target-model"
    return None


# --- a configuration written back as flags ------------------------------------------------------

SAMPLING_FLAGS = {"temperature": ("--temperature", 0.0), "top_k": ("--top-k", 0), "top_p": ("--top-p", 1.0),
                  "min_p": ("--min-p", 0.0), "sampler": ("--sampler", "rejection")}


def command_lines(load: dict, k: int | str, ctx: int | None = None, sampling: dict | None = None) -> dict:
    """The `specmac run` and `specmac serve` command lines that load ``load`` (``Pair.load``'s
    keyword arguments) at K ``k`` (0: plain decoding), -c ``ctx`` in place of options' n_ctx, and
    (run only) the sampling flags that differ from run's defaults: {"run": ..., "serve": ...}."""
    import shlex

    plain = load["draft"] == "none" or not k
    flags = ["--target", load["target"]]
    flags += ["--target-model", load["target_model"]] if load.get("target_model") else []
    if not plain:
        flags += ["--draft", load["draft"]]
        flags += ["--draft-model", load["draft_model"]] if load.get("draft_model") else []
    roles = (("target", True), ("draft", not plain and load["draft"] not in DRAFTERS_WITHOUT_MODEL))
    for role, used in roles:
        for key, value in (load.get(f"{role}_options") or {}).items():
            if used and not (key == "n_ctx" and ctx is not None and str(value) == str(ctx)):
                flags += [f"--{role}-opt", f"{key}={value}"]
    flags += ["-c", str(ctx)] if ctx is not None else []
    flags += [] if plain else ["--k", str(k)]
    run = [*flags]
    for key, (flag, default) in SAMPLING_FLAGS.items():
        value = (sampling or {}).get(key, default)
        if value != default:
            run += [flag, str(value)]
    return {"run": shlex.join(["specmac", "run", *run, "YOUR PROMPT"]),
            "serve": shlex.join(["specmac", "serve", *flags])}
