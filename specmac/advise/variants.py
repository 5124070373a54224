"""What can run each model: its variants (a backend and a dtype or GGUF type), as a draft or a target.

A .gguf file runs on gguf as it is and, dequantised, on torch and mlx at float32 and bfloat16; a
Hugging Face folder runs on torch and mlx and, converted to F16, on gguf; the embedded pair ships
both. A variant's *group* is its output distribution: the same weights in the same precision.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specmac.backends import backend_class, missing_requirements, registry
from specmac.errors import BadOption

DTYPES = {"torch": ("float32", "bfloat16"), "mlx": ("float32", "bfloat16")}
GGUF_TYPE = re.compile(r"(?i)(?:^|[-_.])(f32|f16|bf16|q8_0|q6_k|q5_k_[ms]|q5_[01]|q4_k_[ms]|q4_[01]|"
                       r"q3_k_[sml]|q2_k|iq\w+)(?=\.gguf$|[-_.])")


@dataclass
class Variant:
    """One model in one backend and precision, as a draft or a target."""

    role: str
    backend: str  # a registered backend, or "ngram"
    model: str | None  # a path, or None for the embedded pair
    options: dict = field(default_factory=dict)
    precision: str = ""  # "Q4_K_M", "F16", "float32", ...
    source: str = ""  # the weights: file or folder name

    @property
    def label(self) -> str:
        return self.backend if self.backend == "ngram" else f"{self.backend} {self.precision}"

    @property
    def group(self) -> str:
        """One output distribution: the same weights in the same precision."""
        return f"{self.source} {self.precision}"

    def to_dict(self) -> dict:
        return {"backend": self.backend, "model": self.model, "options": self.options,
                "precision": self.precision, "source": self.source}


# llama.cpp's llama_ftype values (general.file_type of a GGUF)
FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
          11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
          17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def gguf_type(path: str) -> str:
    """The GGUF's type as the file says (general.file_type), else as its name says."""
    try:
        from specmac.backends.gguf import file_type

        ft = file_type(Path(path))
        if ft in FTYPES:
            return FTYPES[ft]
    except (ImportError, OSError, ValueError):
        pass
    m = GGUF_TYPE.search(Path(path).name)
    return m.group(1).upper() if m else "GGUF"


def _derived_from(path: Path) -> str | None:
    """The file a cached GGUF was made from (its specmac_source.json), if any."""
    sidecar = path.parent / "specmac_source.json"
    try:
        return str(Path(json.loads(sidecar.read_text())["source"]).resolve())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def source_name(path: Path) -> str:
    """A file's name, or its folder's for the cache's generic model.gguf."""
    return path.parent.name if path.name == "model.gguf" else path.name


def variants(models: Sequence[str | None], role: str, backends: Sequence[str]) -> list[Variant]:
    """Every (backend, precision) the installed backends can run each model in. A model is a
    .gguf file or a Hugging Face folder (None: the embedded pair, which ships both)."""
    out: list[Variant] = []
    given = {str(Path(m).expanduser().resolve()) for m in models if m}
    for model in models:
        if model is None:
            from specmac import assets

            source = f"embedded {role}"
            for backend in backends:
                if backend == "gguf":
                    out += [Variant(role, "gguf", None, {"quant": q}, q.upper(), source)
                            for q in assets.GGUF_TYPES]
                elif backend in DTYPES:
                    out += [Variant(role, backend, None, {"dtype": d}, d, source) for d in DTYPES[backend]]
                elif backend == "synthetic":
                    out.append(Variant(role, "synthetic", None, {}, "float32", "synthetic pair"))
            continue
        path = Path(model).expanduser()
        fmt = "gguf" if path.is_file() and path.suffix == ".gguf" else "hf" if path.is_dir() else None
        if fmt is None:
            raise BadOption(f"{role}_models: {model} is neither a .gguf file nor a model folder",
                            param=f"{role}_models")
        derived = fmt == "gguf" and _derived_from(path) in given  # e.g. an F16 requantised from a Q4
        for backend in backends:
            if fmt not in backend_class(backend).formats:
                continue
            if derived and backend != "gguf":  # its weights dequantise to those of its source: no new variant
                continue
            if backend == "gguf":
                out.append(Variant(role, "gguf", model, {}, gguf_type(model) if fmt == "gguf" else "F16",
                                   source_name(path)))
            elif backend in DTYPES:
                out += [Variant(role, backend, model, {"dtype": d}, d, source_name(path))
                        for d in DTYPES[backend]]
    return out


def model_backends(only: Sequence[str] | None = None) -> list[str]:
    """The installed model backends (synthetic only when asked for by name)."""
    names = [n for n in registry() if not missing_requirements(n)]
    if only:
        unknown = sorted(set(only) - set(names) - {"ngram"})
        if unknown:
            raise BadOption(f"backends {', '.join(unknown)}: not installed or unknown; choose from "
                            f"{', '.join(n for n in names)}", param="backends")
        return [n for n in only if n != "ngram"]
    return [n for n in names if n != "synthetic"]
