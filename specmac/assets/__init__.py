"""The embedded tiny draft/target model pair (see README.md in this folder).

Paths only: this module imports no ML framework and no numpy.
"""

from __future__ import annotations

import pathlib

ROLES = ("draft", "target")
GGUF_TYPES = ("f16", "q8_0")

ASSETS_DIR = pathlib.Path(__file__).resolve().parent
MANIFEST = ASSETS_DIR / "manifest.json"

__all__ = ["ROLES", "GGUF_TYPES", "ASSETS_DIR", "MANIFEST", "hf_dir", "gguf_file"]


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown embedded model role {role!r}; expected one of: "
                         + ", ".join(ROLES))
    return role


def hf_dir(role: str) -> pathlib.Path:
    """Hugging Face folder (config, float16 safetensors, tokenizer) of the draft or target;
    loads with transformers' AutoModelForCausalLM/AutoTokenizer and with mlx_lm.load."""
    return ASSETS_DIR / _check_role(role)


def gguf_file(role: str, quant: str = "q8_0") -> pathlib.Path:
    """GGUF file of the draft or target in one of GGUF_TYPES."""
    _check_role(role)
    if quant not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF type {quant!r} for the embedded models; expected one "
                         "of: " + ", ".join(GGUF_TYPES))
    return ASSETS_DIR / f"{role}-{quant}.gguf"
