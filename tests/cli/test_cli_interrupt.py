"""Ctrl-C (SIGINT to a real process mid-generation): exit 130, the partial text and its stats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support.helpers import REPO, cli_env

# slow enough to interrupt: every pass of draft and target sleeps; 4000 tokens would take minutes
SLOW = [sys.executable, "-m", "specmac", "run", "--draft", "synthetic", "--target", "synthetic",
        "--temperature", "1", "--max-tokens", "4000", "--target-opt", "latency_ms=20",
        "--draft-opt", "latency_ms=2"]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child needs POSIX")


def _start(args: list[str]) -> subprocess.Popen:
    # SIG_DFL in the child even if this runner ignores SIGINT, so Python installs its handler
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=cli_env(), cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt(proc: subprocess.Popen, wait_for) -> tuple[int, str, str]:
    """Call wait_for(proc) until generation is under way, send SIGINT, collect the result."""
    try:
        wait_for(proc)
        proc.send_signal(signal.SIGINT)
        if proc.stdin is not None and proc.stdin.closed:
            proc.stdin = None  # communicate() would flush it
        out, err = proc.communicate(timeout=60)
        return proc.returncode, out.decode(), err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _first_bytes(proc: subprocess.Popen, n: int = 5) -> bytes:
    """Read n bytes of streamed text (the generation has started), or fail after 60 s."""
    got = bytearray()

    def read() -> None:  # os.read on the fd: communicate() later bypasses any buffered reader
        while len(got) < n and (chunk := os.read(proc.stdout.fileno(), n - len(got))):
            got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    assert len(got) == n, "no text streamed within 60 s"
    return bytes(got)


def test_ctrl_c_prints_partial_text_and_stats():
    proc = _start(SLOW + ["hello"])
    proc.stdin.close()
    head = b""

    def wait(p):
        nonlocal head
        head = _first_bytes(p)
        time.sleep(0.3)

    code, rest, err = _interrupt(proc, wait)
    text = head.decode() + rest
    assert code == 130, err
    assert "Traceback" not in err
    assert "finish: interrupted" in err and "acceptance" in err and "time: draft" in err
    n_tokens = int(err.split(" tokens in ")[0].split()[-1])
    assert 5 <= n_tokens < 4000
    assert text.endswith("\n") and len(text) == n_tokens + 1  # every counted token was printed


def test_ctrl_c_with_json_prints_one_complete_object():
    proc = _start(SLOW + ["--json", "--prompt-file", "-"])

    def wait(p):  # the prompt is read from stdin inside `run`, after every import
        p.stdin.write(b"hello")
        p.stdin.close()
        time.sleep(1.0)

    code, out, err = _interrupt(proc, wait)
    assert code == 130, err
    assert "Traceback" not in err
    result = json.loads(out)
    assert result["finish_reason"] == "interrupted"
    assert 0 < result["n_tokens"] == len(result["token_ids"]) == len(result["text"]) < 4000
    assert len(result["per_position_acceptance"]) == 4
