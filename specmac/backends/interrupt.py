"""Ctrl-C and SIGTERM while C code runs: held, then delivered once the C call has returned.

Python runs a signal handler between bytecodes, so a signal that arrives during a long C call (a
GGUF load, a framework's import) is handled in whatever Python code the C code calls back into: a
ctypes log callback, which can only print the KeyboardInterrupt and go on ("Exception ignored on
calling ctypes callback function"), or a pybind11 hook, where it aborts the process. Inside
``held_signals`` the handlers only note the signal; C code that can stop early polls ``pending``
(llama.cpp's load progress callback returns False), and on the way out the original handler gets
the signal (KeyboardInterrupt, or the CLI's SIGTERM handler, or the default action). Imports the
standard library alone.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from collections.abc import Iterator
from types import ModuleType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held_signals() -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM for the block; yields the list of signals that arrived (poll it to
    stop early). Re-raised with their original handlers after the block. Outside the main thread
    (where handlers cannot be set) it holds nothing."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def note(signum: int, _frame) -> None:
        pending.append(signum)

    old = {}
    for s in SIGNALS:
        handler = signal.getsignal(s)
        if handler is not None and handler != signal.SIG_IGN:  # None: set from C, cannot be put back
            old[s] = signal.signal(s, note)
    try:
        yield pending
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


def import_held(name: str) -> ModuleType:
    """``importlib.import_module(name)`` with Ctrl-C held until the import is done: an import
    stopped half-way can abort the process (torch's C++ start-up) or leave a module half set up."""
    with held_signals():
        return importlib.import_module(name)
