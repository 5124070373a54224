"""llama.cpp model files through llama-cpp-python: finding a GGUF (a path, a hub file, the embedded
pair's, an HF folder converted), its type, requantising it, loading it with llama.cpp's log
captured (a failure is one line) and reading its vocabulary. The backend itself is ``gguf``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import llama_cpp

from specmac.backends import gguf_quantize
from specmac.backends.conversion import cache, convert
from specmac.backends.conversion.hf_check import check_folder, check_hub
from specmac.backends.interrupt import held_signals
from specmac.errors import BadOption, ModelNotFound
from specmac.vocab import Vocab

GGUF_MAGIC = b"GGUF"
HUB_FILE = re.compile(r"^[\w.-]+/[\w.-]+:[^:]+$")  # repo_id:filename
ALL_LAYERS = 0x7FFFFFFF  # llama.cpp clamps this to the model's layer count
FLASH_ATTN = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}
LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR in the ggml this package builds
QUANTS = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
          "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}


# --- device and thread decisions --------------------------------------------------------------
def gpu_offload() -> str | None:
    """The accelerator this llama.cpp build offloads layers to ("metal", "cuda", "gpu"), or None."""
    if not llama_cpp.llama_supports_gpu_offload():
        return None
    info = llama_cpp.llama_print_system_info().decode(errors="replace").upper()
    return "metal" if "METAL" in info else "cuda" if "CUDA" in info else "gpu"


def default_threads() -> int:
    """CPUs this process may use, halved when SMT is on (llama.cpp gains nothing from siblings)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    smt = Path("/sys/devices/system/cpu/smt/active")
    if smt.is_file() and smt.read_text().strip() == "1":
        n //= 2
    return max(1, n)


# --- finding and loading a model --------------------------------------------------------------
def resolve_model(model: str | None, role: str, quant: str | None) -> tuple[str, dict | None]:
    """-> (the GGUF file to load, the conversion's sidecar or None). None -> the embedded pair's GGUF
    of ``quant``; a .gguf file (requantised once to ``quant`` if given, cached); a Hugging Face folder
    (written once as F16 GGUF, then requantised if ``quant`` says so); or ``repo_id:filename``."""
    if model is None:
        from specmac import assets

        quant = quant or "q8_0"
        if quant not in assets.GGUF_TYPES:
            raise BadOption(f"option quant={quant!r} is not one of {', '.join(assets.GGUF_TYPES)} "
                            "(the embedded pair's GGUF types)")
        path = assets.gguf_file(role, quant)
        if not path.is_file():
            raise ModelNotFound(f"the embedded {role} model {path.name} is missing: reinstall specmac "
                                "or pass a .gguf path")
        return str(path), None
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{model} is a folder without config.json: give a .gguf file or a "
                                "Hugging Face model folder")
        check_folder(path)  # readable configs, a tokenizer, whole safetensors files
        f16, meta = convert.hf_to_gguf(path)
        if quant and quant != "f16":
            return str(requantize(f16, quant)[0]), meta | {"quant": quant}
        return str(f16), meta
    if not path.is_file() and HUB_FILE.match(model):
        path = Path(hub_file(model))
    if path.is_file():
        check_gguf(str(path))
        if quant and _readable_file_type(path) != QUANTS[quant]:
            f, meta = requantize(path, quant)
            return str(f), meta
        return str(path), None
    raise ModelNotFound(f"model {model} not found: give a .gguf path, a Hugging Face folder or "
                        "repo_id:filename from the hub")


# llama.cpp's llama_ftype values (general.file_type of a GGUF) -> the type's name
FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
          11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
          17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}
GGUF_TYPE = re.compile(r"(?i)(?:^|[-_.])(f32|f16|bf16|q8_0|q6_k|q5_k_[ms]|q5_[01]|q4_k_[ms]|q4_[01]|"
                       r"q3_k_[sml]|q2_k|iq\w+)(?=\.gguf$|[-_.])")


def gguf_type(path: str) -> str:
    """The GGUF's type as the file says (general.file_type), else as its name says."""
    try:
        ft = file_type(Path(path))
        if ft in FTYPES:
            return FTYPES[ft]
    except (OSError, ValueError):
        pass
    m = GGUF_TYPE.search(Path(path).name)
    return m.group(1).upper() if m else "GGUF"


# GGUF metadata value types -> struct format (8: string, 9: array, read apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def file_type(path: Path) -> int | None:
    """general.file_type of a GGUF (a llama_ftype), None where the header has none. Only the
    header's key-value pairs are walked, up to that key (general.* come first): a full reader
    parses the whole vocabulary and every tensor's entry, seconds on a large model. A header that
    is not one (bad magic, truncated, unknown value type) is a ValueError."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != GGUF_MAGIC:
            raise ValueError("no GGUF header")
        # a byte-swapped version number: a big-endian file
        order = "<" if struct.unpack("<I", head[4:8])[0] < 0x10000 else ">"
        n_kv = struct.unpack(order + "Q", head[16:24])[0]

        def read(fmt: str):
            size = struct.calcsize(order + fmt)
            data = f.read(size)
            if len(data) < size:
                raise ValueError("the GGUF header is truncated")
            return struct.unpack(order + fmt, data)[0]

        def skip(kind: int) -> None:
            if kind == 8:
                f.seek(read("Q"), os.SEEK_CUR)
            elif kind == 9:
                item, count = read("I"), read("Q")
                if item in _SCALARS:
                    f.seek(count * struct.calcsize(_SCALARS[item]), os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item)
            elif kind in _SCALARS:
                read(_SCALARS[kind])
            else:
                raise ValueError(f"unknown GGUF value type {kind}")

        for _ in range(n_kv):
            key = f.read(read("Q"))
            kind = read("I")
            if key == b"general.file_type" and kind in _SCALARS:
                return int(read(_SCALARS[kind]))
            skip(kind)
    return None


def _readable_file_type(path: Path) -> int | None:
    """general.file_type of a file about to be requantised, read by gguf-py's full reader where it is
    installed: it also checks the tensor table against the file, so a truncated file is refused
    here in one line (the header alone, ``file_type``, would pass it)."""
    try:
        try:
            import gguf
        except ImportError:
            return file_type(path)
        field = gguf.GGUFReader(str(path)).get_field("general.file_type")
        return int(field.contents()) if field is not None else None
    except Exception as e:  # gguf-py fails on junk and truncated files with whatever error it meets
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise ModelNotFound(f"{path} is not a readable GGUF file ({why}): check that the file is a "
                            "complete GGUF model") from None


def requantize(path: str | Path, quant: str) -> tuple[Path, dict]:
    """The GGUF as ``quant``, made once with llama_model_quantize (allow_requantize: a quantised
    source is dequantised first, so F16 holds exactly its values) and cached: (file, sidecar)."""
    def build(src: Path, out: Path) -> None:  # in a child, so that Ctrl-C stops it at once
        gguf_quantize.run_child(src, out / "model.gguf", quant, QUANTS[quant], default_threads())

    lib = f"llama-cpp-python {llama_cpp.__version__} llama_model_quantize"
    what = f"{'an' if quant == 'f16' else 'a'} {quant.upper()} GGUF"
    entry, meta = cache.converted(path, f"gguf-{quant}", build, what=what,
                                  details={"quant": quant, "converter": lib})
    return entry / "model.gguf", meta


def hub_file(spec: str) -> str:
    """Download ``repo_id:filename`` (like ``Llama.from_pretrained``) and return the local path."""
    repo_id, _, filename = spec.partition(":")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ModelNotFound(f"downloading {spec} needs huggingface_hub: pip install huggingface_hub "
                            "(or pass a local .gguf path)") from None
    check_hub(repo_id, filename)  # cached, or reachable within seconds
    try:
        return hf_hub_download(repo_id, filename)
    except Exception as e:  # network, auth and missing-file errors all mean "cannot get it"
        raise ModelNotFound(f"cannot download {filename} from {repo_id}: {str(e).splitlines()[0]}") from None


def check_gguf(path: str) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelNotFound(f"{path} is not a GGUF file (starts with {magic!r}, not b'GGUF'): "
                            "pass a .gguf model file")


_log_lines: list[tuple[int, str]] = []


@llama_cpp.llama_log_callback
def _collect_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    _log_lines.append((level, text.decode("utf-8", errors="replace")))


@contextlib.contextmanager
def captured_log() -> Iterator[list[tuple[int, str]]]:
    """Collect llama.cpp's log instead of printing it; restore llama-cpp-python's logger after."""
    _log_lines.clear()
    llama_cpp.llama_log_set(_collect_log, ctypes.c_void_p(0))
    try:
        yield _log_lines
    finally:  # llama-cpp-python's own callback, or None (llama.cpp's default) if it has none
        restore = getattr(getattr(llama_cpp, "_logger", None), "llama_log_callback", None)
        llama_cpp.llama_log_set(restore, ctypes.c_void_p(0))


def first_error(lines: list[tuple[int, str]]) -> str:
    """The first error llama.cpp logged (the cause; later ones say "failed to load"), sans function name."""
    errors = [re.sub(r"^\w+: ", "", t.strip()) for lvl, t in lines if lvl == LOG_ERROR and t.strip()]
    return errors[0] if errors else "llama.cpp gave no reason"


def extra_bufts_safe() -> bool:
    """Whether llama.cpp's extra CPU buffer types (weight repacking) are safe in this build: not
    where ggml was built with AMX, whose Q8_0/Q4_0 path crashes (llama.cpp issue 20824; a native
    build includes AMX on CPUs that have it)."""
    return "AMX_INT8 = 1" not in llama_cpp.llama_print_system_info().decode(errors="replace")


@contextlib.contextmanager
def peer_defaults() -> Iterator[None]:
    """While inside: llama-cpp-python's own ``Llama`` and ``llama_cpp.server`` (the peers that
    benchmarks and tests set beside specmac) load models with llama.cpp's extra CPU buffer types as
    specmac's ``extra_bufts`` auto chooses them (``extra_bufts_safe``): off where loading a Q4_K_M,
    Q8_0 or Q4_0 file with them crashes the process (llama.cpp issue 20824). Neither takes
    such an argument; both read llama_model_default_params as they load, so that is what changes."""
    from llama_cpp import llama as llama_module

    lib = llama_module.llama_cpp
    defaults = lib.llama_model_default_params
    safe = extra_bufts_safe()

    def params():
        p = defaults()
        p.use_extra_bufts = safe
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


def peer_llama(path: str | Path, **kwargs) -> llama_cpp.Llama:
    """llama-cpp-python's own ``Llama(path, **kwargs)``, loaded under ``peer_defaults``."""
    from llama_cpp import llama as llama_module

    with peer_defaults():
        return llama_module.Llama(str(path), **kwargs)


def load_model(path: str, n_gpu_layers: int = 0, vocab_only: bool = False,
               extra_bufts: bool = True) -> llama_cpp.llama_model_p:
    check_gguf(path)
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
    params.vocab_only = vocab_only
    params.use_extra_bufts = extra_bufts
    with captured_log() as log, held_signals() as pending:
        # Ctrl-C is held during the C call and stops the load at the next tensor; raised after it
        params.progress_callback = stop = llama_cpp.llama_progress_callback(lambda _p, _u: not pending)
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        del stop
        if pending and model is not None:  # came after the last tensor: free it, then the signal
            llama_cpp.llama_model_free(model)
    if model is None:
        raise ModelNotFound(f"llama.cpp cannot load {path} ({first_error(log)}): "
                            "check that the file is a complete GGUF model")
    return model


def read_vocab(model: llama_cpp.llama_model_p) -> Vocab:
    """Token bytes for every id (control tokens as their literal text), EOS/EOG ids, BOS id."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)
    pieces, eos, special, unused = [], set(), set(), set()
    for i in range(n):
        k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        if k < 0:  # the piece is longer than the buffer: -k is its length
            buf = ctypes.create_string_buffer(-k)
            k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        pieces.append(buf.raw[:k])
        if llama_cpp.llama_vocab_is_eog(vocab, i):
            eos.add(i)
        if llama_cpp.llama_vocab_is_control(vocab, i):
            special.add(i)
        if llama_cpp.llama_vocab_get_attr(vocab, i) & llama_cpp.LLAMA_TOKEN_ATTR_UNUSED:
            unused.add(i)
    eos |= {t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0}
    bos = llama_cpp.llama_vocab_bos(vocab)
    return Vocab(pieces, eos_ids=frozenset(eos), bos_id=bos if bos >= 0 else None,
                 special_ids=frozenset(special | eos), n_logits=n, unused_ids=frozenset(unused))


# --- the backend ------------------------------------------------------------------------------
