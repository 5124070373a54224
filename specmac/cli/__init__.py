"""The specmac command line: ``main`` is the click group; each command module attaches its commands
to it on import, and only this package's face imports them (none imports back)."""

from specmac.cli import advise, chat, compare, models, probes, run, serve  # noqa: F401  (each attaches its commands)
from specmac.cli.app import main

__all__ = ["main"]
