"""What every CLI module shares and that needs nothing else of the CLI: the one-line user error,
one line out of a library message, and KEY=VALUE flags."""

from __future__ import annotations

import click


class UserError(click.ClickException):
    """A one-line message; exit status 2."""

    exit_code = 2


def one_line(message: str) -> str:
    """Collapse a message onto one line (library messages sometimes carry newlines)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def parse_kv(values: tuple[str, ...], flag: str) -> dict[str, str]:
    """("key=value", ...) -> {key: value}; anything else is a one-line UserError naming ``flag``."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{flag} {item!r} is not key=value: write e.g. {flag} n_threads=2")
        out[key.strip()] = value.strip()
    return out
