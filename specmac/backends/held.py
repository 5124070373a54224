"""What a backend's cache holds: its token ids kept in step with every pass, and a saved state.

``BaseBackend`` wraps the passes, rewinds, resets and restores a subclass defines with these, so
every backend (a plugin too) knows which tokens its cache holds (``BaseBackend.held``): a new prompt
reuses the prefix a backend already holds, and a conversation's cache can be saved and restored.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Saved:
    """A sequence's cache, saved (``BaseBackend.save``): the tokens it holds, the backend's own state
    of them, and what that state takes in memory."""

    tokens: tuple[int, ...]
    state: Any
    nbytes: int


def appends(fn: Callable) -> Callable:
    """A pass that appends ``tokens``: ``held`` gains what the cache gained (all of them, or on an
    error what the backend kept), or becomes unknown where it was not in step before the pass."""
    @functools.wraps(fn)
    def pass_(self, tokens, *a, **kw):
        if self.__dict__.get("_in_pass"):  # a subclass's pass calling its base's: the outer one counts
            return fn(self, tokens, *a, **kw)
        before = self.n_past
        self._in_pass = True
        try:
            return fn(self, tokens, *a, **kw)
        finally:
            self._in_pass = False
            _grew(self, before, tokens)
    return pass_


def _grew(backend, before: int, tokens) -> None:
    """After a pass that appended ``tokens`` at ``before``: ``held`` gains what the cache kept of
    them, or becomes unknown where it was not in step with the cache before."""
    held = backend.__dict__.get("_held", [] if before == 0 else None)
    if held is not None and len(held) == before and backend.n_past >= before:
        held.extend(int(t) for t in tokens[: backend.n_past - before])
        backend._held = held
    else:
        backend._held = None


def appends_many(fn: Callable) -> Callable:
    """A pass over several lanes (``score_many``): each lane's ``held`` gains what its cache gained."""
    @functools.wraps(fn)
    def pass_(self, asks, *a, **kw):
        if self.__dict__.get("_in_pass"):
            return fn(self, asks, *a, **kw)
        before = [(lane, lane.n_past, tokens) for lane, tokens, _ in asks]
        # a lane's own pass, called from this one, does not count twice
        marked = list({id(x): x for x in [self, *(lane for lane, _, _ in before)]
                       if not x.__dict__.get("_in_pass")}.values())
        for lane in marked:
            lane._in_pass = True
        try:
            return fn(self, asks, *a, **kw)
        finally:
            for lane in marked:
                lane._in_pass = False
            for lane, n, tokens in before:
                _grew(lane, n, tokens)
    return pass_


def cuts(fn: Callable) -> Callable:
    """A rewind or reset: ``held`` loses what the cache lost (known again once the cache is empty)."""
    @functools.wraps(fn)
    def cut(self, *a, **kw):
        try:
            return fn(self, *a, **kw)
        finally:
            held = self.__dict__.get("_held")
            if self.n_past == 0:
                self._held = []
            elif held is not None:
                del held[self.n_past:]
    return cut


def restores(fn: Callable) -> Callable:
    """A restore: ``held`` is the tokens saved."""
    @functools.wraps(fn)
    def restore(self, saved):
        self._held = None
        fn(self, saved)
        if self.n_past == len(saved.tokens):
            self._held = list(saved.tokens)
    return restore
