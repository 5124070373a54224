"""User-facing errors: one line that says what is wrong and what to do.

The CLI turns every ``SpecmacError`` into exit status 2 with no traceback; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class SpecmacError(Exception):
    """A problem with the user's input or environment (not a bug in specmac)."""


class BackendNotInstalled(SpecmacError):
    """The framework a backend needs is not importable."""


class UnknownBackend(SpecmacError):
    """No backend is registered under that name."""


class BadOption(SpecmacError):
    """A backend option or sampling parameter is out of range or of the wrong type."""


class ModelNotFound(SpecmacError):
    """A model path or hub id that cannot be loaded."""


class VocabMismatch(SpecmacError):
    """Draft and target tokenizers disagree, so speculation cannot be lossless."""


class ContextOverflow(SpecmacError):
    """The prompt does not fit in the model's context window."""
