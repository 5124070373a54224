"""Ctrl-C and SIGTERM during a long llama_decode: llama.cpp's abort callback stops it, the cache is
as before the call, the signal follows (KeyboardInterrupt; the CLI exits 130 on it).

The embedded target prefills a full context in tens of milliseconds, too fast to aim a signal at
from outside reliably, so the in-process tests drive the real callback with the signal already
held; the process test sends real signals to a child that spends nearly all its time in decodes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.support.helpers import REPO, cli_env

llama_cpp = pytest.importorskip("llama_cpp", reason="the gguf backend needs llama-cpp-python, not installed "
                                                   "(pip install 'specmac[gguf]')")
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals to a child need POSIX")

PROMPT = list(range(10, 20))
LONG = list(range(30, 130))  # more than ABORTABLE_TOKENS: the abortable path


@pytest.fixture(scope="module")
def gguf():
    from specmac.backends import gguf

    return gguf


@pytest.fixture
def spy(monkeypatch):
    """Every llama_decode status, in order."""
    statuses: list[int] = []
    real = llama_cpp.llama_decode

    def decode(ctx, batch):
        statuses.append(rc := real(ctx, batch))
        return rc

    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    return statuses


def held(*arrivals: list[int], raises: bool = True):
    """A stand-in for held_signals: the n-th block finds arrivals[n] already held (the signal came
    before or during the decode); on the way out KeyboardInterrupt, as SIGINT's handler does, or
    nothing (a handler that returns, as a draining server's SIGTERM does)."""
    blocks = iter(arrivals)

    @contextlib.contextmanager
    def fake():
        pending = list(next(blocks, []))
        yield pending
        if pending and raises:
            raise KeyboardInterrupt

    return fake


def cache_end(backend) -> int:
    """One past the last position llama.cpp holds for the sequence."""
    return llama_cpp.llama_memory_seq_pos_max(backend._mem, 0) + 1


def test_a_held_signal_aborts_the_decode_and_leaves_the_cache_as_it_was(gguf, spy, monkeypatch, capfd):
    b = gguf.GGUFBackend(None)
    b.prefill(PROMPT)
    monkeypatch.setattr(gguf, "held_signals", held([signal.SIGINT]))
    with pytest.raises(KeyboardInterrupt):
        b.prefill(LONG)
    assert spy[-1] == gguf.DECODE_ABORTED  # the callback stopped llama_decode, it did not finish
    assert b.n_past == cache_end(b) == len(PROMPT)
    assert capfd.readouterr().err == ""  # llama.cpp's lines about the abort are not shown
    monkeypatch.undo()
    after = b.prefill(LONG)
    fresh = gguf.GGUFBackend(None)
    fresh.prefill(PROMPT)  # the same two decodes: batched logits differ from one decode's in the last bits
    np.testing.assert_array_equal(after, fresh.prefill(LONG))


def test_a_signal_after_the_decode_finished_still_leaves_n_past_and_the_cache_equal(gguf, spy, monkeypatch):
    b = gguf.GGUFBackend(None)
    b.prefill(PROMPT)
    arrived: list[int] = []  # filled once llama_decode has returned: the callback never said stop
    real = llama_cpp.llama_decode

    def late(ctx, batch):
        rc = real(ctx, batch)
        arrived.append(signal.SIGINT)
        return rc

    @contextlib.contextmanager
    def fake():
        yield arrived
        if arrived:
            raise KeyboardInterrupt

    monkeypatch.setattr(llama_cpp, "llama_decode", late)
    monkeypatch.setattr(gguf, "held_signals", fake)
    with pytest.raises(KeyboardInterrupt):
        b.score(LONG)
    assert b.n_past == cache_end(b) == len(PROMPT)


def test_a_handler_that_returns_gets_the_decode_done(gguf, spy, monkeypatch):
    b = gguf.GGUFBackend(None)
    b.prefill(PROMPT)
    monkeypatch.setattr(gguf, "held_signals", held([signal.SIGTERM], [], raises=False))
    rows = b.score(LONG)
    assert spy[-2:] == [gguf.DECODE_ABORTED, 0]  # stopped, then decoded again
    assert b.n_past == cache_end(b) == len(PROMPT) + len(LONG)
    fresh = gguf.GGUFBackend(None)
    fresh.prefill(PROMPT)
    np.testing.assert_array_equal(rows, fresh.score(LONG))


def test_short_decodes_run_without_the_callback(gguf, monkeypatch):
    b = gguf.GGUFBackend(None)
    b.prefill(PROMPT)  # the first decode is cold: abortable
    monkeypatch.setattr(gguf, "held_signals", held([signal.SIGINT]))
    b.score([40, 41, 42])  # under ABORTABLE_TOKENS: no held signals, no callback, nothing stopped
    assert b.n_past == cache_end(b) == len(PROMPT) + 3


# the child prefills a full context again and again: nearly all its time is inside llama_decode
CHILD = textwrap.dedent("""
    import json, sys
    import llama_cpp
    from specmac.backends.gguf import GGUFBackend
    from specmac.cli.app import _sigterm_like_ctrl_c

    _sigterm_like_ctrl_c()  # the CLI's: SIGTERM raises KeyboardInterrupt as Ctrl-C does
    b = GGUFBackend(None, n_threads=1)
    statuses = []
    real = llama_cpp.llama_decode
    def decode(ctx, batch):
        statuses.append(rc := real(ctx, batch))
        return rc
    llama_cpp.llama_decode = decode
    ids = list(range(10, b.n_ctx - 2))
    print("ready", flush=True)
    try:
        while True:
            b.reset()
            b.prefill(ids)
    except KeyboardInterrupt:
        end = llama_cpp.llama_memory_seq_pos_max(b._mem, 0) + 1
        print(json.dumps({"aborted": statuses[-1] == 2, "n_past": b.n_past, "end": end}), flush=True)
        sys.exit(130)
""")


def _interrupt_child(signum: int) -> tuple[int, dict, str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=cli_env(), cwd=REPO, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.3)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)  # bounded: a decode that cannot stop still ends
        return proc.returncode, json.loads(out.strip().splitlines()[-1]), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_real_signal_stops_a_decode_in_a_real_process(signum):
    # a signal can land in the Python between two decodes (about 1% of the time): try a few children
    for _ in range(5):
        code, state, err = _interrupt_child(signum)
        assert code == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert state["n_past"] == state["end"]  # the cache holds exactly what n_past says
        if state["aborted"]:
            assert state["n_past"] == 0  # the prefill being decoded left nothing behind
            return
    pytest.fail("no signal landed inside llama_decode in 5 tries: the abort callback never stopped one")
