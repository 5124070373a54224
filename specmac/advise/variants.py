"""What can run each model: its variants (a backend and a precision), as a draft or a target.

Each backend class says which formats it loads and in which precisions (``BaseBackend.variants``),
so a plugin backend is ranked like a built-in. A variant's *group* is its output distribution: the
same weights in the same precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specmac.backends import backend_class, missing_requirements, registry
from specmac.backends.conversion.cache import derived_from
from specmac.core.sources import FREE as MODEL_FREE
from specmac.errors import BadOption


@dataclass
class Variant:
    """One model in one backend and precision, as a draft or a target."""

    role: str
    backend: str  # a registered backend, a model-free drafter ("ngram", "lookup") or "lookup+BACKEND"
    model: str | None  # a path, or None for the embedded pair
    options: dict = field(default_factory=dict)
    precision: str = ""  # "Q4_K_M", "F16", "float32", ...
    source: str = ""  # the weights: file or folder name

    @property
    def model_free(self) -> bool:
        return self.backend in MODEL_FREE

    @property
    def hybrid(self) -> bool:
        return "+" in self.backend

    @property
    def label(self) -> str:
        return self.backend if self.model_free else f"{self.backend} {self.precision}"

    @property
    def group(self) -> str:
        """One output distribution: the same weights in the same precision."""
        return f"{self.source} {self.precision}"

    def to_dict(self) -> dict:
        return {"backend": self.backend, "model": self.model, "options": self.options,
                "precision": self.precision, "source": self.source}


def variants(models: Sequence[str | None], role: str, backends: Sequence[str]) -> list[Variant]:
    """Every (backend, precision) the installed backends can run each model in, as each backend
    class says (``BaseBackend.variants``). A model is a .gguf file or a Hugging Face folder (None:
    each backend's default model, the embedded pair for the built-ins)."""
    out: list[Variant] = []
    given = {str(Path(m).expanduser().resolve()) for m in models if m}
    for model in models:
        fmt = None
        if model is not None:
            path = Path(model).expanduser()
            fmt = "gguf" if path.is_file() and path.suffix == ".gguf" else "hf" if path.is_dir() else None
            if fmt is None:
                raise BadOption(f"{role}_models: {model} is neither a .gguf file nor a model folder",
                                param=f"{role}_models")
        # e.g. an F16 requantised from a given Q4: on a backend that converts it, its weights are its source's
        derived = fmt == "gguf" and derived_from(Path(model).expanduser()) in given
        for backend in backends:
            cls = backend_class(backend)
            if fmt is not None and (fmt not in cls.formats or (derived and fmt in cls.converted_formats)):
                continue
            source = cls.source_name(model, role)
            out += [Variant(role, backend, model, dict(options), precision, source)
                    for options, precision in cls.variants(model, role)]
    return out


def model_backends(only: Sequence[str] | None = None) -> list[str]:
    """The installed model backends (synthetic only when asked for by name)."""
    names = [n for n in registry() if not missing_requirements(n)]
    if only:
        unknown = sorted(set(only) - set(names) - set(MODEL_FREE))
        if unknown:
            raise BadOption(f"backends {', '.join(unknown)}: not installed or unknown; choose from "
                            f"{', '.join(n for n in names)}", param="backends")
        return [n for n in only if n not in MODEL_FREE]
    return [n for n in names if n != "synthetic"]
