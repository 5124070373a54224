"""--profile FILE [--precision GROUP] for `serve` and `run`: the pair (and K) advise saved with
``specmac advise --save FILE`` (specmac.advise.profile), loaded in place of the model flags.

The profile names the whole pair, so --target, --draft, --draft-model and the --*-opt flags beside
it are refused (one line, exit 2); --target-model picks the group of that target file; an --k given
on the command line wins over the profile's K (K changes speed, never the output distribution), and
-c/--ctx-size over its context windows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import click
from click.core import ParameterSource

from specmac.cli.app import UserError, parse_k
from specmac.errors import SpecmacError

PAIR_FLAGS = {"target": "--target", "draft": "--draft", "draft_model": "--draft-model",
              "target_opt": "--target-opt", "draft_opt": "--draft-opt"}


def profile_options(f: Callable) -> Callable:
    f = click.option("--precision", metavar="GROUP",
                     help="With --profile: load the first choice of this precision group (its name as "
                          "advise prints it, or just the precision, e.g. F16).")(f)
    return click.option("--profile", "profile_path", type=click.Path(dir_okay=True), metavar="FILE",
                        help="Load the configuration `specmac advise --save FILE` ranked first (of the "
                             "group of --precision or --target-model, else overall).")(f)


def given(name: str) -> bool:
    """Whether the flag of parameter ``name`` was typed (or set by the environment), not defaulted."""
    ctx = click.get_current_context()
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)


@dataclass
class Choice:
    """The configuration a profile chose: what loads it, the K to run it at, and why it is this one."""

    load: dict  # Pair.load's keyword arguments
    k: int | str
    line: str  # "first choice of group ... in FILE (...): ..."
    group: str

    def pair(self):
        from specmac.api import Pair

        return Pair.load(**self.load)


def profile_choice(path: str | None, precision: str | None, kw: dict, k_text: str) -> Choice | None:
    """The profile's chosen configuration, checked (file, group, models, backends, options) before
    anything loads; None without --profile."""
    from specmac.advise.profile import choose, describe, load_kwargs, read_profile
    from specmac.backends import backend_class, missing_requirements, registry
    from specmac.core.sources import FREE, split_draft

    if path is None:
        if precision is not None:
            raise UserError("--precision picks a group of a profile: add --profile FILE, or drop --precision")
        return None
    for name, flag in PAIR_FLAGS.items():
        if given(name):
            raise UserError(f"{flag} conflicts with --profile {path}: the profile names the whole pair; "
                            f"drop {flag} (or drop --profile)")
    prof = read_profile(path)
    group, config, why = choose(prof, path, precision, kw.get("target_model"))
    load = load_kwargs(config)
    for role in ("target", "draft"):
        try:  # a draft names its sources: a lookup needs no backend, a hybrid's model does
            names = [load[role]] if role == "target" else [
                p for p in split_draft(load[role]) if p not in FREE]
        except SpecmacError as e:  # a drafter another specmac version wrote
            raise UserError(f"--profile {path}: its draft {load[role]!r} is refused ({e}): run "
                            "`specmac advise --save FILE` again") from None
        if not names:
            continue
        name = names[0]
        if name not in registry() or missing_requirements(name):
            raise UserError(f"--profile {path}: its {role} backend {name!r} is not installed here: install "
                            f"it (see `specmac backends`), or choose another group with --precision")
        try:
            backend_class(name).parse_options(load[f"{role}_options"])
        except SpecmacError as e:  # the options of another specmac version, say
            raise UserError(f"--profile {path}: its {role} options {load[f'{role}_options']} are refused "
                            f"({e}): run `specmac advise --save FILE` again") from None
    _ctx(load, kw.get("ctx_size"))
    line = describe(prof, group, config, path, why)
    if given("k_text"):
        k = parse_k(k_text)
        line += f"; --k {k_text} in place of the profile's K {config['k']}"
    else:
        # a plain configuration (K 0) drafts nothing, but a request's prediction does: serve's default
        k = config["k"] or "auto"
    return Choice(load, k, line, group["group"])


def _ctx(load: dict, ctx: int | None) -> None:
    """-c/--ctx-size, typed now, in place of the profile's n_ctx for the target and a draft model."""
    from specmac.cli.flags import DRAFTERS_WITHOUT_MODEL, with_ctx

    if ctx is None:
        return
    draft = load["draft"].split("+")[-1]
    for role, backend in (("target", load["target"]), ("draft", draft)):
        if backend not in DRAFTERS_WITHOUT_MODEL:
            rest = {k: v for k, v in load[f"{role}_options"].items() if k != "n_ctx"}
            load[f"{role}_options"] = with_ctx(backend, rest, ctx)
