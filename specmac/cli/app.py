"""The specmac command line: parse, call the library, render.

Every user error (a SpecmacError, a bad flag, a typo) is one line on stderr and exit status 2;
SPECMAC_DEBUG=1 also prints its traceback. Anything else is a bug and keeps its traceback.
Ctrl-C exits 130. This module imports click alone at import time so that ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import click

from specmac.cli.base import UserError, one_line
from specmac.cli.base import parse_kv as parse_kv  # KEY=VALUE flags, shared by the commands
from specmac.cli.flags import load_pair as load_pair  # the pair flags, shared by the commands
from specmac.cli.flags import pair_options as pair_options
from specmac.errors import SpecmacError

# `specmac` alone prints its help through this UsageError (click >= 8.2); it stays as it is
_HELP_ERRORS = tuple(c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c)


def _debug_traceback(e: BaseException) -> None:
    if os.environ.get("SPECMAC_DEBUG") == "1":
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)


def _user_error(e: Exception, hint: str = "") -> UserError:
    """SpecmacError or click.UsageError -> UserError; SPECMAC_DEBUG=1 prints the traceback first."""
    _debug_traceback(e)
    msg = one_line(e.format_message() if isinstance(e, click.ClickException) else str(e))
    return UserError((msg.rstrip(".") + hint) if hint else msg or type(e).__name__)


def _usage_hint(e: click.UsageError) -> str:
    path = e.ctx.command_path if e.ctx is not None else "specmac"
    return f"; see '{path} --help'"


# a backend's n_ctx as advice ("raise n_ctx", "a smaller n_ctx"), not a value ("n_ctx=2048")
N_CTX = re.compile(r"\b(?:the draft's )?n_ctx\b(?!=)")


def flag_language(e: SpecmacError, command: click.Command | None) -> str:
    """The library names parameters; the user typed flags. When the error says which parameter it
    is about and this command has a flag for it, the message names the flag instead: a message
    that starts with the parameter's name starts with the flag, any other gets the flag in front.
    Advice to change n_ctx names -c/--ctx-size where the command has it."""
    msg = one_line(str(e))
    param = getattr(e, "param", None)
    if command is not None and any(p.name == "ctx_size" for p in command.params):
        msg = N_CTX.sub("-c/--ctx-size", msg)  # "raise n_ctx": the flag that raises it
    if not param or command is None:
        return msg
    for p in command.params:
        if not isinstance(p, click.Option):
            continue
        flag = max(p.opts, key=len)
        names = {p.name, flag.lstrip("-").replace("-", "_"), flag.lstrip("-")}
        if param in names:
            for name in sorted(names, key=len, reverse=True):
                if msg.startswith((name + " ", name + ":")):
                    return flag + msg[len(name):]
            return f"{flag}: {msg}"
    return msg


class Command(click.Command):
    """Rewords library errors into the flags of this command (see ``flag_language``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpecmacError as e:
            _debug_traceback(e)
            raise UserError(flag_language(e, self)) from None


class Group(click.Group):
    """Turns user errors into one line + exit 2, and Ctrl-C into exit 130, for every command."""

    command_class = Command

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:  # a typo in the top-level flags or the command name
            if isinstance(e, _HELP_ERRORS):
                raise
            raise _user_error(e, _usage_hint(e)) from None

    def invoke(self, ctx: click.Context) -> Any:
        _sigterm_like_ctrl_c()
        try:
            check_streams()
            return super().invoke(ctx)
        except BrokenPipeError:  # the reader went away (`| head`): end quietly, as cat does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            _debug_traceback(e)
            if e.filename is None:  # stdout: what is still buffered there would fail again at exit
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise UserError(f"no space left on the device while writing {e.filename or 'the output'}: "
                            "free some space or write elsewhere") from None
        except SpecmacError as e:
            raise _user_error(e) from None
        except UserError as e:  # raised by a command's own checks
            _debug_traceback(e)
            raise
        except click.UsageError as e:  # bad flags of a subcommand: click would print 4 lines
            if isinstance(e, _HELP_ERRORS):
                raise
            raise _user_error(e, _usage_hint(e)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(130)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def check_streams() -> None:
    """A closed stdout (``>&-``) or working folder that no longer exists: one line, before anything runs."""
    if sys.stdout is None:
        raise UserError("standard output is closed: give the command somewhere to write, e.g. > /dev/null")
    try:
        os.getcwd()
    except FileNotFoundError:
        raise UserError("the working folder no longer exists (deleted while in use): cd to a folder "
                        "that exists and run again") from None


def _sigterm_like_ctrl_c() -> None:
    """SIGTERM stops a command as Ctrl-C does (what was generated, then the stats; exit 130)."""
    import signal
    import threading

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _version_message() -> str:
    from specmac import __version__
    from specmac.backends import libraries, library_version

    found = [f"{lib} {v}" for lib in libraries() if (v := library_version(lib))]
    return f"specmac {__version__} ({', '.join(found)})"


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_message())
        ctx.exit()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show the version of specmac and of every installed backend library.")
def main() -> None:
    """Speculative decoding across MLX, llama.cpp (GGUF) and PyTorch backends.

    \b
    specmac run --draft mlx --target gguf "def quicksort(xs):"
    specmac run --draft ngram --target gguf --prompt-file code.py
    specmac verify --draft synthetic --target synthetic --temperature 1
    specmac backends

    SPECMAC_DEBUG=1 shows the traceback behind an error message.
    """


# --- shared options ------------------------------------------------------------------------

def sampling_options(f: Callable | None = None, *, temperature: float = 0.0) -> Callable:
    """--temperature/--top-k/--top-p/--min-p/--sampler/--seed; ``@sampling_options`` or
    ``@sampling_options(temperature=1.0)`` for another default temperature."""
    opts = [
        click.option("--temperature", type=click.FloatRange(min=0), default=temperature, metavar="T",
                     show_default=True, help="0 is greedy."),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, metavar="K",
                     help="Keep the K most likely tokens; 0 is off."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, metavar="P",
                     show_default=True, help="Nucleus sampling mass; 1 is off."),
        click.option("--min-p", type=click.FloatRange(0, 1, max_open=True), default=0.0, metavar="P",
                     show_default=True, help="Drop tokens below min-p x the top probability; 0 is off."),
        click.option("--sampler", type=click.Choice(["rejection", "coupled"]), default="rejection",
                     show_default=True,
                     help="How drafts are verified at T > 0: 'rejection' (the rejection rule) or "
                          "'coupled' (Gumbel noise keyed by --seed and position, shared by draft and "
                          "target: the text is plain decoding's text at that seed, whatever the draft "
                          "and K; lower acceptance)."),
        click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, metavar="N",
                     help="Seed of the sampler, >= 0. With --sampler coupled the same seed gives the "
                          "same text with or without speculation, any draft, any --k, auto included; "
                          "with 'rejection' only for one fixed draft and --k (not auto, whose K "
                          "follows measured timings)."),
    ]

    def apply(g: Callable) -> Callable:
        for o in reversed(opts):
            g = o(g)
        return g

    return apply(f) if f is not None else apply


def sampling_params(kw: dict):
    from specmac.core.sampling import SamplingParams

    return SamplingParams(kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"], kw["sampler"])


def parse_k(value: str) -> int | str:
    """An integer 1..256, or "auto"."""
    from specmac.api import check_k
    from specmac.core.costs import K_LIMIT

    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise UserError(f"--k {value!r} is not a number: use an integer 1..{K_LIMIT} or 'auto'") from None
    try:
        return check_k(k)
    except SpecmacError:
        raise UserError(f"--k {k} is out of range: use an integer 1..{K_LIMIT} or 'auto'") from None


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def use_color(flag: bool | None, as_json: bool) -> bool:
    """--color/--no-color win; otherwise colour only on a terminal and without NO_COLOR set."""
    if as_json:
        return False
    if flag is not None:
        return flag
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def check_outputs(out: str | None, plot: str | None) -> None:
    """--out and --plot can be written: checked before anything is loaded or measured."""
    from specmac.compare.results import check_output

    if out:
        check_output(out, "out")
    if plot:
        check_output(plot, "plot", image=True)


@contextlib.contextmanager
def owned_outputs(out: str | None, plot: str | None) -> Iterator[None]:
    """check_outputs, then hold --out and --plot for the whole run: a second run writing the same
    file is refused with one line naming this one (specmac.files.output_lock)."""
    from specmac.files import output_lock

    check_outputs(out, plot)
    with contextlib.ExitStack() as stack:
        for path, flag in ((out, "out"), (plot, "plot")):
            if path and not (flag == "plot" and out and os.path.abspath(out) == os.path.abspath(plot)):
                stack.enter_context(output_lock(path, folder=False, param=f"--{flag}"))
        yield


def report_record(record: dict, out: str | None, draw, as_json: bool, show) -> None:
    """Write the record (--out) and the plot (--plot), then print it as JSON or as text."""
    from specmac.compare.results import write_json

    if out:
        write_json(out, record)
    if draw:
        draw()
    if as_json:
        emit_json(record)
    else:
        show(record)
    from specmac.cli.render import busy_line

    if line := busy_line(record):  # after the numbers, where it is read
        click.echo(line, err=True)
