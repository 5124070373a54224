"""Any model file on any backend: GGUF -> Hugging Face folder, HF folder -> GGUF (other GGUF types:
``specmac.backends.gguf.requantize``).

Each conversion runs once per (source, format, precision) and lands in the cache folder
(``specmac.backends.conversion.cache``) with its source's SHA-256 beside it. Frameworks are
imported inside the functions, so the torch and mlx backends can use the GGUF path without
llama-cpp-python and the gguf backend can use the HF path without torch.
"""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path

from specmac.backends.conversion import cache
from specmac.errors import BackendNotInstalled, BadOption, ModelNotFound

GGUF_MAGIC = b"GGUF"
HF_DTYPES = ("float32", "float16", "bfloat16")


def is_gguf(path: str | Path) -> bool:
    path = Path(path).expanduser()
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def check_gguf(path: str | Path) -> Path:
    """The path of a file that starts as a GGUF file does, else ModelNotFound saying what it is."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ModelNotFound(f"{path} is a folder, not a GGUF file: torch and mlx load a Hugging Face "
                            "folder as it is")
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise ModelNotFound(f"{path} {what}: give a .gguf model file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelNotFound(f"cannot read {path} ({e.strerror})") from None
    if magic != GGUF_MAGIC:
        raise ModelNotFound(f"{path} is not a GGUF file (it does not start with 'GGUF'): give a .gguf "
                            "model file")
    return path


def needs(modules: tuple[str, ...], what: str, extra: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendNotInstalled(f"{what} needs {' and '.join(missing)}: pip install 'specmac[{extra}]'")


# --- GGUF -> Hugging Face folder (torch, mlx) ---------------------------------------------------
def gguf_to_hf(path: str | Path, dtype: str = "float32") -> tuple[Path, dict]:
    """The GGUF dequantised to ``dtype`` by transformers' GGUF loader, saved as a safetensors
    folder (config, weights, tokenizer): (folder, sidecar)."""
    if dtype not in HF_DTYPES:
        raise BadOption(f"dtype {dtype!r} is not one of {', '.join(HF_DTYPES)}", param="dtype")
    path = check_gguf(path)
    needs(("torch", "transformers", "gguf", "accelerate"), "loading a GGUF file as a Hugging Face model",
          "convert")
    from importlib.metadata import version

    details = {"dtype": dtype, "converter": f"transformers {version('transformers')} GGUF loader, "
                                            f"gguf {version('gguf')}"}
    return cache.converted(path, f"hf-{dtype}", lambda src, out: _gguf_to_hf(src, out, dtype),
                           what=f"a Hugging Face folder ({dtype})", details=details)


def _gguf_to_hf(src: Path, out: Path, dtype: str) -> None:
    from specmac.backends.interrupt import held_signals

    with held_signals():  # Ctrl-C waits for the imports: torch's, stopped half-way, aborts the process
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

    was_on, bars = hf_logging.is_progress_bar_enabled(), cache.progress_bars()
    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
    tqdm_env = os.environ.get("TQDM_DISABLE")
    if not bars:  # the dequantising loop is a plain tqdm bar: off in logs and pipes
        os.environ["TQDM_DISABLE"] = "1"
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                     dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError, NotImplementedError, struct.error) as e:  # unsupported, junk
        raise ModelNotFound(f"transformers cannot load {src}: {_first_line(e)}") from None
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
        if tqdm_env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = tqdm_env
    if getattr(model, "hf_quantizer", None) is not None:  # the weights are plain tensors now
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# --- Hugging Face folder -> GGUF (gguf) --------------------------------------------------------
def hf_to_gguf(folder: str | Path) -> tuple[Path, dict]:
    """The folder's model as an F16 GGUF written with gguf-py (Llama, Qwen2): (file, sidecar)."""
    needs(("gguf",), "loading a Hugging Face folder in the gguf backend", "gguf")
    from importlib.metadata import version

    from specmac.backends.conversion.hf_to_gguf import write_gguf

    entry, meta = cache.converted(folder, "gguf-f16", lambda src, out: write_gguf(src, out / "model.gguf"),
                                  what="an F16 GGUF", details={"quant": "f16",
                                                               "converter": f"gguf-py {version('gguf')}"})
    return entry / "model.gguf", meta
