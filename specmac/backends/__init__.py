"""The backend contract, the registry and ``load_backend``.

A backend is anything that can *append tokens and return the logits at every appended position in
one forward pass* (``score``) and *forget everything after position n* (``rewind``). Built-ins are
registered exactly like plugins (entry-point group ``specmac.backends``); this module imports no ML
framework: only ``backend_class`` imports a backend module, on first use.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from specmac.errors import BackendNotInstalled, BadOption, UnknownBackend
from specmac.vocab import Vocab

ENTRY_POINT_GROUP = "specmac.backends"

# name -> "module:Class"; plugins add to this through the entry-point group
BUILTINS: dict[str, str] = {
    "synthetic": "specmac.backends.synthetic:SyntheticBackend",
    "mlx": "specmac.backends.mlx:MLXBackend",
    "gguf": "specmac.backends.gguf:GGUFBackend",
    "torch": "specmac.backends.torch:TorchBackend",
}
# the importable modules each built-in needs (checked without importing them)
REQUIRES: dict[str, tuple[str, ...]] = {
    "synthetic": (),
    "mlx": ("mlx", "mlx_lm"),
    "gguf": ("llama_cpp",),
    "torch": ("torch", "transformers", "safetensors"),
}


@runtime_checkable
class Backend(Protocol):
    name: str
    vocab: Vocab
    n_ctx: int

    @property
    def n_past(self) -> int: ...  # tokens currently in the KV cache
    def score(self, tokens: Sequence[int]) -> np.ndarray: ...  # float32 [len(tokens), n_logits]
    def prefill(self, tokens: Sequence[int]) -> np.ndarray: ...  # logits of the last token [n_logits]
    def rewind(self, n_past: int) -> None: ...  # truncate the cache to n_past tokens
    def reset(self) -> None: ...
    def sync(self) -> None: ...  # barrier for honest timing
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def info(self) -> dict: ...


@dataclass(frozen=True)
class Option:
    """A backend option settable as ``--draft-opt key=value``; type is int, float, str or bool."""

    type: type
    default: Any
    help: str
    choices: tuple | None = None

    def parse(self, key: str, raw: Any) -> Any:
        if not isinstance(raw, str):
            value = raw
        elif self.type is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise BadOption(f"option {key}={raw!r} is not a boolean: use true or false")
            value = raw.lower() in ("1", "true", "yes", "on")
        else:
            try:
                value = self.type(raw)
            except ValueError:
                raise BadOption(f"option {key}={raw!r} is not a valid {self.type.__name__}: "
                                f"{self.help}") from None
        if self.choices is not None and value not in self.choices:
            raise BadOption(f"option {key}={value!r} is not one of {', '.join(map(str, self.choices))}")
        return value


class BaseBackend:
    """Shared plumbing; subclasses implement score, rewind, encode, decode and set the fields."""

    name: ClassVar[str] = ""
    library: ClassVar[str] = ""  # distribution whose version results record
    options: ClassVar[dict[str, Option]] = {}
    vocab: Vocab
    n_ctx: int
    model_id: str = ""
    resolved: dict  # option values after defaults and hardware detection

    @property
    def n_past(self) -> int:
        raise NotImplementedError

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        return self.score(tokens)[-1]

    def reset(self) -> None:
        self.rewind(0)

    def sync(self) -> None:
        """Backends that return numpy arrays have already synchronised; nothing to wait for."""

    @classmethod
    def devices(cls) -> list[str]:
        return ["cpu"]

    @classmethod
    def parse_options(cls, raw: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in raw.items():
            if key not in cls.options:
                known = ", ".join(sorted(cls.options)) or "none"
                raise BadOption(f"unknown option {key!r} for the {cls.name} backend; known: {known}")
            out[key] = cls.options[key].parse(key, value)
        return out

    def info(self) -> dict:
        return {"backend": self.name, "model": self.model_id, "library": self.library,
                "library_version": library_version(self.library), "n_ctx": self.n_ctx,
                "options": dict(getattr(self, "resolved", {})), "vocab": self.vocab.to_dict()}


def library_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist) if dist else None
    except importlib.metadata.PackageNotFoundError:
        return None


def registry() -> dict[str, str]:
    """Every backend name -> "module:Class": built-ins, then plugins (which cannot shadow them)."""
    names = dict(BUILTINS)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


def missing_requirements(name: str) -> list[str]:
    return [m for m in REQUIRES.get(name, ()) if importlib.util.find_spec(m) is None]


def install_hint(name: str, missing: str) -> str:
    if name in BUILTINS:
        return f"the {name} backend needs {missing}: pip install 'specmac[{name}]'"
    return f"the {name} backend needs {missing}: install the package that provides it"


def backend_class(name: str) -> type:
    """Import and return the class registered as ``name``."""
    reg = registry()
    if name not in reg:
        raise UnknownBackend(f"unknown backend {name!r}; choose one of: {', '.join(sorted(reg))}")
    missing = missing_requirements(name)
    if missing:
        raise BackendNotInstalled(install_hint(name, missing[0]))
    module, _, attr = reg[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:  # a plugin's own dependency
        raise BackendNotInstalled(install_hint(name, e.name or str(e))) from None
    return getattr(mod, attr)


def load_backend(name: str, model: str | None = None, options: dict[str, Any] | None = None,
                 role: str = "target") -> BaseBackend:
    """Instantiate a backend. model None = the embedded pair (``role`` picks draft or target)."""
    cls = backend_class(name)
    return cls(model, role=role, **cls.parse_options(options or {}))
