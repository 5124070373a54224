"""No library log line reaches the user unless asked: the thread fit's refits included."""

from __future__ import annotations

from specmac.backends import load_backend
from tests.support.helpers import skip_unless_installed


@skip_unless_installed("gguf")
def test_a_thread_refit_says_nothing_on_stderr(capfd):
    """llama.cpp prints "set_n_threads: n_threads = 1, n_threads_batch = 1" on every new count; the
    thread fit sets one in the middle of a run, so the line is captured like every other."""
    gguf = load_backend("gguf", None, None, role="target")
    capfd.readouterr()
    for n in (1, 2, 1):
        gguf._set_threads(n)
    assert gguf.resolved["n_threads"] == 1
    assert capfd.readouterr().err == ""
