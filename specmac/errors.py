"""User-facing errors: one line that says what is wrong and what to do.

Library messages name parameters (``n_max``, ``context``); the CLI turns every ``SpecmacError``
into exit status 2 with no traceback, and rewords a parameter into its flag (``--n-max``) where
the error says which parameter it is about. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SpecmacError(Exception):
    """A problem with the user's input or environment (not a bug in specmac).

    ``param``: the parameter the message starts with, so that the CLI can name its flag instead.
    """

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BackendNotInstalled(SpecmacError):
    """The framework a backend needs is not importable."""


class BrokenBackend(SpecmacError):
    """A registered backend (a plugin) whose module fails to import or names no backend class."""


class UnknownBackend(SpecmacError):
    """No backend is registered under that name."""


class BadOption(SpecmacError):
    """A parameter, backend option or sampling parameter is out of range or of the wrong type."""


class ModelNotFound(SpecmacError):
    """A model path or hub id that cannot be loaded."""


class VocabMismatch(SpecmacError):
    """Draft and target tokenizers disagree, so speculation cannot be lossless."""


class ContextOverflow(SpecmacError):
    """The tokens do not fit in the model's context window."""


class BadTokens(SpecmacError):
    """Token ids that a model cannot take: none at all, or ids outside its vocabulary."""
