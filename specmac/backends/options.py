"""A backend's option: its type, bounds and choices, and how a value given as text is read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from specmac.errors import BadOption

TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}


@dataclass(frozen=True)
class Option:
    """A backend option (``options={"key": value}``; on the command line ``--draft-opt key=value``);
    type is int, float, str or bool. ``lo``/``hi`` bound numbers (inclusive); floats are finite.
    A value given as a string is parsed; any other value must already have the type (no bools for
    numbers, no fractions for ints). None keeps the default."""

    type: type
    default: Any
    help: str
    choices: tuple | None = None
    lo: float | None = None
    hi: float | None = None

    def parse(self, key: str, raw: Any) -> Any:
        if raw is None:
            return self.default
        value = self._parse_text(key, raw) if isinstance(raw, str) else self._check_type(key, raw)
        if self.type is float and not math.isfinite(value):
            raise BadOption(f"option {key}={raw!r} is not a finite number: {self.help}")
        if self.type in (int, float) and ((self.lo is not None and value < self.lo)
                                          or (self.hi is not None and value > self.hi)):
            raise BadOption(f"option {key}={value!r} is out of range: "
                            f"use {_bound(self.lo)}..{_bound(self.hi)}")
        if self.choices is not None and value not in self.choices:
            raise BadOption(f"option {key}={value!r} is not one of {', '.join(map(str, self.choices))}")
        return value

    def _parse_text(self, key: str, raw: str) -> Any:
        if self.type is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise BadOption(f"option {key}={raw!r} is not a boolean: use true or false")
            return raw.lower() in ("1", "true", "yes", "on")
        try:
            return self.type(raw)
        except ValueError:
            raise BadOption(f"option {key}={raw!r} is not a valid {self.type.__name__}: "
                            f"{self.help}") from None

    def _check_type(self, key: str, raw: Any) -> Any:
        ok = {bool: (bool, np.bool_), int: (int, np.integer), float: (int, float, np.integer, np.floating),
              str: (str,)}.get(self.type, (self.type,))
        if isinstance(raw, ok) and (self.type in (bool, str) or not isinstance(raw, (bool, np.bool_))):
            return self.type(raw)
        raise BadOption(f"option {key}={raw!r} is a {type(raw).__name__}, not {TYPE_NAMES[self.type]}: "
                        f"{self.help}")


def _bound(b: float | None) -> str:
    if b is None:
        return ""
    return "2**63-1" if b == 2**63 - 1 else str(int(b)) if float(b).is_integer() else f"{b:g}"
