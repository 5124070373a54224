"""Hostile input, part two (issue 24): outputs shared by two runs, kept pass costs that lie, signals
during C calls, flags outside their mode, a broken model cache, a plugin with another vocabulary.
As in tests/test_hostile.py, a refusal is one line on stderr, exit 2, no traceback, nothing left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specmac.cli import main

REPO = Path(__file__).resolve().parents[1]
PAIR = ("--draft", "synthetic", "--target", "synthetic")
QUICK_COMPARE = ("compare", "--pair", "synthetic:synthetic", "--k", "1,2", "--n-prompts", "2",
                 "--max-tokens", "8")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SPECMAC_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env | extra


def _spawn(args, cwd, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specmac", *args], cwd=cwd, env=kw.pop("env", _env()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _one_line(code: int, err: str, needle: str, status: int = 2) -> None:
    lines = err.strip().splitlines()
    assert code == status, f"exit {code}: {err}"
    assert "Traceback" not in err
    assert len(lines) == 1, f"expected one line, got {err!r}"
    assert needle.lower() in lines[0].lower(), lines[0]


def invoke(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


# --- 1. outputs are owned ---------------------------------------------------------------------

def test_two_compares_into_one_folder_one_runs(tmp_path):
    """Started together: one measures, the other exits 2 naming it (or, if the first was already
    done, its complete record); the folder holds one complete record."""
    args = [*QUICK_COMPARE, "--repeats", "6", "--out", "D"]
    first = _spawn(args, tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "D" / ".specmac-lock").exists() and first.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    second = _spawn(args, tmp_path)
    (_, err1), (_, err2) = first.communicate(timeout=120), second.communicate(timeout=120)
    assert first.returncode == 0, err1.decode()
    assert second.returncode == 2
    line = err2.decode().strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert ("in use by another specmac run (pid " in line and "compare --pair" in line) or \
        "already holds the complete record" in line, line
    record = json.loads((tmp_path / "D" / "results.json").read_text())
    assert record["complete"] is True and len(record["runs"]) == 3 * 2 * 6
    assert not (tmp_path / "D" / ".specmac-lock").exists()


def test_a_folder_held_by_another_run_is_refused_naming_it(tmp_path):
    from specmac.files import output_lock

    with output_lock(tmp_path / "D", folder=True, command="specmac compare --out D (the first)"):
        r = invoke([*QUICK_COMPARE, "--out", tmp_path / "D"])
    _one_line(r.exit_code, r.stderr, f"in use by another specmac run (pid {os.getpid()}: specmac compare "
              "--out D (the first))")
    assert not (tmp_path / "D").exists()  # made for the lock, removed with it


@pytest.mark.parametrize("command", [["probe-parallelism", "--backend", "synthetic", "--out", "{f}"],
                                     ["advise", *PAIR, "--out", "{f}"],
                                     ["report", "{d}", "--out", "{d}"]])
def test_file_outputs_are_held_too(tmp_path, command):
    from specmac.files import output_lock

    d = tmp_path / "rec"
    d.mkdir()
    (d / "results.json").write_text("{}")
    f = tmp_path / "out.json"
    folder = command[0] == "report"
    with output_lock(d if folder else f, folder=folder, command="specmac first"):
        r = invoke([a.format(f=f, d=d) for a in command])
    _one_line(r.exit_code, r.stderr, "in use by another specmac run")
    assert not f.exists()


def test_a_complete_record_is_not_overwritten(tmp_path):
    assert invoke([*QUICK_COMPARE, "--repeats", "1", "--out", tmp_path / "D"]).exit_code == 0
    before = (tmp_path / "D" / "results.json").read_bytes()
    r = invoke([*QUICK_COMPARE, "--repeats", "1", "--out", tmp_path / "D"])
    _one_line(r.exit_code, r.stderr, "already holds the complete record of another run")
    assert (tmp_path / "D" / "results.json").read_bytes() == before


def test_an_incomplete_record_is_measured_again(tmp_path):
    (tmp_path / "D").mkdir()
    (tmp_path / "D" / "results.json").write_text(json.dumps({"complete": False}))
    assert invoke([*QUICK_COMPARE, "--repeats", "1", "--out", tmp_path / "D"]).exit_code == 0
    assert json.loads((tmp_path / "D" / "results.json").read_text())["complete"] is True


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_json_outputs_follow_the_umask(tmp_path, mask, mode):
    from specmac.files import write_json

    old = os.umask(mask)
    try:
        write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
