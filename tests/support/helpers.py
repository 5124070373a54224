"""What several test files share: the repository, the synthetic pair's flags, a bad-input case, the
one-line-error check and the environment of a real `python -m specmac` process."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from specmac.backends import missing_requirements

REPO = Path(__file__).resolve().parents[2]
SYN = ("--target", "synthetic")
PAIR = ("--draft", "synthetic", "--target", "synthetic")


@dataclass(frozen=True)
class Case:
    """One bad input: the command line and what its one line must say (case-insensitive)."""

    id: str
    args: tuple[str, ...]
    needle: str
    backend: str | None = None  # a real backend the case needs (skipped only where it is missing)
    setup: str | None = None  # a fixture's name for the state the case needs
    stdin: bytes = b""
    subprocess: bool = False  # bytes in argv or stdin, or signals: a real process
    env: tuple[tuple[str, str], ...] = ()  # extra environment (a real process)


# a wait said while it lasts (specmac.cli.progress): a slow load before the mistake shows may say it
WAIT_LINE = re.compile(r"^(specmac( serve)?: )?loading the models \(\d+ s so far\)$")


def error_lines(stderr: str) -> list[str]:
    """stderr's lines, less those saying what a wait before the error was doing."""
    return [x for x in stderr.strip().splitlines() if not WAIT_LINE.match(x)]


def assert_one_line_error(case: Case, code: int, stdout: str, stderr: str) -> None:
    """Exit status 2, no traceback, one line on stderr naming the problem, nothing on stdout."""
    lines = error_lines(stderr)
    assert code == 2, f"exit {code}, stderr: {stderr}"
    assert "Traceback" not in stderr
    assert len(lines) == 1, f"expected one line, got: {stderr!r}"
    assert lines[0].startswith("Error: ")
    assert case.needle.lower() in lines[0].lower(), lines[0]
    assert stdout == ""


def cli_env(**extra: str) -> dict[str, str]:
    """This environment for a child `python -m specmac`: this checkout first on the path, no debug
    tracebacks, colour left to the test."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPECMAC_DEBUG", "NO_COLOR")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env | extra


def skip_unless_installed(name: str):
    """Skip (saying what to install) unless every framework the backend needs is importable."""
    missing = missing_requirements(name)
    return pytest.mark.skipif(bool(missing), reason=f"the {name} backend needs {', '.join(missing)}, "
                                                    f"not installed (pip install 'specmac[{name}]')")
