"""Streaming in a real pseudo-terminal (util-linux ``script``): colour on a tty, none when piped."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.support.helpers import REPO, cli_env

ANSI = re.compile(r"\x1b\[[0-9;]*m")
GREEN, RED, CYAN = "\x1b[32m", "\x1b[31m", "\x1b[36m"
# temperature 1 with a noisy synthetic draft: accepted, corrected and bonus tokens all occur
RUN = [sys.executable, "-m", "specmac", "run", "--draft", "synthetic", "--target", "synthetic",
       "--temperature", "1", "--max-tokens", "60", "--seed", "3", "hello"]

needs_script = pytest.mark.skipif(shutil.which("script") is None,
                                  reason="util-linux `script` is not installed (apt-get install bsdutils)")


def _env(**extra: str) -> dict[str, str]:
    return cli_env(TERM="xterm-256color", **extra)


def in_pty(args: list[str], **env: str) -> str:
    """Run args with stdout and stderr on a fresh pseudo-terminal; -> what the terminal showed."""
    cmd = ["script", "-q", "-e", "-c", shlex.join(args), "/dev/null"]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=_env(**env), cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.decode()


@needs_script
def test_tty_streams_coloured_tokens_with_a_legend():
    shown = in_pty(RUN)
    assert GREEN in shown and RED in shown and CYAN in shown
    assert "legend:" in shown and "accepted draft" in shown and "target correction" in shown
    lines = ANSI.sub("", shown).replace("\r", "").splitlines()
    stats = next(i for i, line in enumerate(lines) if line.startswith("60 tokens in"))
    assert len(lines[stats - 1]) == 60  # the text: 60 one-character tokens, colour codes aside
    assert lines[stats + 1].startswith("acceptance") and lines[stats + 3].startswith("time: draft")


@needs_script
@pytest.mark.parametrize("how", ["--no-color", "NO_COLOR"])
def test_tty_without_colour_when_asked(how):
    shown = in_pty(RUN + ["--no-color"]) if how == "--no-color" else in_pty(RUN, NO_COLOR="1")
    assert "\x1b[" not in shown and "60 tokens in" in shown


def test_piped_output_is_plain_text():
    r = subprocess.run(RUN, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout and "\x1b[" not in r.stderr
    assert len(r.stdout) == 61 and "legend" not in r.stderr  # the text and a newline; stats on stderr
    assert "60 tokens in" in r.stderr


@needs_script
def test_tty_same_text_as_piped():
    """Colour changes nothing but the escape codes."""
    shown = ANSI.sub("", in_pty(RUN)).replace("\r", "")
    piped = subprocess.run(RUN, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120).stdout
    assert piped in shown
