"""Any model file on any backend: GGUF -> Hugging Face folder, HF folder -> GGUF (other GGUF types:
``specmac.backends.gguf.requantize``).

Each conversion runs once per (source, format, precision) and lands in the cache folder
(``specmac.backends.conversion.cache``) with its source's SHA-256 beside it. Frameworks are
imported inside the functions, so the torch and mlx backends can use the GGUF path without
llama-cpp-python and the gguf backend can use the HF path without torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import struct
import warnings
from collections.abc import Iterator
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

    with _library_output(cache.progress_bars()):
        try:
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                         dtype=getattr(torch, dtype), **_dequantised())
        except (OSError, ValueError, KeyError, NotImplementedError, struct.error) as e:  # unsupported, junk
            raise ModelNotFound(f"transformers cannot load {src}: {_first_line(e)}") from None
        if getattr(model, "hf_quantizer", None) is not None:  # the weights are plain tensors now
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)


def _dequantised() -> dict:
    """Ask for every weight unpacked to plain tensors (what a folder holds). transformers with a
    GgufConfig would otherwise keep them packed where it has kernels, and it warns that they "stay
    quantized" even where its loader unpacks them all (Llama and most architectures)."""
    try:
        from transformers import GgufConfig
    except ImportError:  # a loader without the option unpacks every weight
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


@contextlib.contextmanager
def _library_output(bars: bool) -> Iterator[None]:
    """transformers says nothing but errors, and shows its progress bars (the GGUF unpacking one
    included) only where ``bars``; its settings and huggingface_hub's are put back after."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_loader
    except ImportError:  # another transformers layout: nothing to reroute
        gguf_loader = None

    verbosity, was_on, hub_off = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(),
                                  are_progress_bars_disabled())
    plain_tqdm = getattr(gguf_loader, "tqdm", None)
    with warnings.catch_warnings():  # huggingface_hub warns where HF_HUB_DISABLE_PROGRESS_BARS overrides
        warnings.simplefilter("ignore")
        hf_logging.set_verbosity_error()
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
    if plain_tqdm is not None:  # a plain tqdm, deaf to the switch above (TQDM_DISABLE is read at import)
        gguf_loader.tqdm = hf_logging.tqdm
    try:
        yield
    finally:
        if plain_tqdm is not None:
            gguf_loader.tqdm = plain_tqdm
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_logging.set_verbosity(verbosity)
            (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
            (disable_progress_bars if hub_off else enable_progress_bars)()


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
