"""Where the bench scripts find the real models: one folder and the file names inside it.

The folder is $SPECMAC_MODELS, default ~/.cache/specmac/models. It holds the official
Qwen2.5-Coder Instruct Q4_K_M GGUF files (../shared/models/materialize.sh DIR qwen, SHA-256
checked) and, for the mlx and torch backends, HF folders converted from them
(specmac models convert FILE --out DIR/<name>-hf). Every script that takes --models-dir defaults
to ``models_dir()``.
"""

from __future__ import annotations

import os
from pathlib import Path

from specmac.compare.results import code_measured

# the commit as the script starts, which its provenance records: a tree edited during a long run is
# not what it measured (every bench script that imports this module; the others call it themselves)
code_measured()

ENV = "SPECMAC_MODELS"
DEFAULT = "~/.cache/specmac/models"

QWEN_05B_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF
QWEN_15B_GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"  # Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF
QWEN_05B_HF = "qwen2.5-coder-0.5b-instruct-hf"  # the 0.5B file dequantized to fp32 safetensors
QWEN_15B_HF = "qwen2.5-coder-1.5b-instruct-hf"  # the 1.5B file dequantized to fp32 safetensors
QWEN_15B_F16 = "qwen2.5-coder-1.5b-instruct-f16.gguf"  # the 1.5B file requantised to F16:
# python -m specmac.backends.gguf_quantize DIR/QWEN_15B_GGUF DIR/QWEN_15B_F16 1 2
QWEN_15B_BF16 = "qwen2.5-coder-1.5b-instruct-hf-bf16"  # specmac models convert ... --dtype bfloat16


def models_dir() -> Path:
    """$SPECMAC_MODELS, or ~/.cache/specmac/models when it is unset or empty."""
    return Path(os.environ.get(ENV) or DEFAULT).expanduser()


def add_models_dir(ap, *aliases: str) -> None:
    """The --models-dir flag every bench script takes (argparse), defaulting to models_dir()."""
    ap.add_argument("--models-dir", *aliases, type=lambda s: Path(s).expanduser(), default=models_dir(),
                    help=f"folder of the real models (default ${ENV} or {DEFAULT}; now {models_dir()})")
