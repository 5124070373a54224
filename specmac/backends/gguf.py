"""llama.cpp through llama-cpp-python's low-level API: GGUF files, CPU or GPU offload.

``score`` builds its own ``llama_batch`` and asks for logits at exactly the positions it returns (no
``logits_all``, which would reserve n_ctx x vocab floats); ``rewind`` removes KV entries with
``llama_memory_seq_rm``. llama.cpp's log is captured while loading, so a failure is one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from specmac.backends import MAX_CTX, MAX_THREADS, BaseBackend, Option, gguf_quantize, hf
from specmac.backends.conversion import cache, convert
from specmac.backends.conversion.hf_check import check_folder, check_hub
from specmac.backends.interrupt import held_signals
from specmac.errors import BadOption, BadTokens, ModelNotFound, SpecmacError
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


def file_type(path: Path) -> int | None:
    """general.file_type of a GGUF (a llama_ftype), read with gguf-py if it is installed."""
    try:
        import gguf
    except ImportError:
        return None
    field = gguf.GGUFReader(str(path)).get_field("general.file_type")
    return int(field.contents()) if field is not None else None


def _readable_file_type(path: Path) -> int | None:
    try:
        return file_type(path)
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
class GGUFBackend(BaseBackend):
    """A GGUF model in llama.cpp; ``n_gpu_layers`` is the device parameter (0 = CPU only)."""

    name = "gguf"
    library = "llama-cpp-python"
    formats = ("gguf", "hf")  # a .gguf file; an HF folder is converted to GGUF once (cached)
    converted_formats = ("hf",)
    fast_plain = True
    options = {
        "quant": Option(str, None, "GGUF type: of the embedded pair (f16|q8_0, default q8_0), or a given "
                                   "GGUF/folder requantised once (cached; default as given)",
                        choices=tuple(QUANTS)),
        "n_ctx": Option(int, None, "context window; default 2048 or the model's training context if smaller",
                        lo=2, hi=MAX_CTX),
        "n_threads": Option(int, None, "CPU threads for single-token and batched passes alike",
                            lo=1, hi=MAX_THREADS),
        "n_batch": Option(int, 512, "most tokens per llama_decode (also the micro-batch)", lo=1, hi=MAX_CTX),
        "n_gpu_layers": Option(int, None, "layers offloaded to the GPU; -1 all; default all if the build "
                                          "can offload, else 0", lo=-1, hi=100_000),
        # llama.cpp's default; on the CPU auto turns it on, which makes batched and serial logits equal
        "flash_attn": Option(str, "auto", "flash attention", choices=tuple(FLASH_ATTN)),
        "extra_bufts": Option(str, "auto", "llama.cpp's extra CPU buffer types (weights repacked for "
                              "faster Q4_0/Q4_K kernels); auto: on unless ggml was built with AMX "
                              "(crashes on Q8_0/Q4_0)", choices=("auto", "on", "off")),
    }

    def __init__(self, model: str | None = None, *, role: str = "target", **opts) -> None:
        o = {k: v.default for k, v in self.options.items()} | opts
        for key in ("n_ctx", "n_threads", "n_batch"):
            if o[key] is not None and o[key] < 1:
                raise BadOption(f"option {key}={o[key]} is out of range: use an integer >= 1")
        path, converted = resolve_model(model, role, o["quant"])
        self.model_id = model or f"embedded:{role}-{o['quant'] or 'q8_0'}"
        ngl = o["n_gpu_layers"] if o["n_gpu_layers"] is not None else -1 if gpu_offload() else 0
        extra = o["extra_bufts"] == "on" or (o["extra_bufts"] == "auto" and extra_bufts_safe())
        self._model = load_model(path, ngl, extra_bufts=extra)
        self._vocab_p = llama_cpp.llama_model_get_vocab(self._model)
        n_train = llama_cpp.llama_model_n_ctx_train(self._model)
        if o["n_ctx"] is not None and o["n_ctx"] > n_train > 0:
            raise BadOption(f"option n_ctx={o['n_ctx']} is out of range: use 2..{n_train} (the model's "
                            "training context)")
        self.n_ctx = o["n_ctx"] or min(2048, n_train)
        threads = o["n_threads"] or default_threads()
        n_batch = min(o["n_batch"], self.n_ctx)
        self._ctx, flash = self._new_context(path, self.n_ctx, n_batch, threads, o["flash_attn"])
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._finalizer = weakref.finalize(self, _release, self._model, self._ctx, self._batch)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.vocab = read_vocab(self._model)
        self._n_vocab = self.vocab.n_logits
        self._n_batch = n_batch
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab_p))
        self._n_past = 0
        self.resolved = {"path": path, "n_ctx": self.n_ctx, "n_ctx_train": n_train,
                         "n_threads": threads, "n_threads_batch": threads, "n_batch": n_batch,
                         "n_ubatch": n_batch, "n_gpu_layers": ngl, "flash_attn": flash,
                         "device": (gpu_offload() or "cpu") if ngl else "cpu", "add_bos": self._add_bos,
                         "extra_bufts": "on" if extra else "off"}
        if model is None or o["quant"] or converted:  # quant only where it chose what was loaded
            self.resolved["quant"] = o["quant"] or (converted or {}).get("quant") or "q8_0"
        if converted:
            self.resolved["source_sha256"] = converted["source_sha256"]

    def _new_context(self, path: str, n_ctx: int, n_batch: int, threads: int, flash: str):
        """-> the llama_context and the flash attention state ("on", "off"; "auto" if llama.cpp
        did not say what auto chose)."""
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_batch, 1
        p.n_threads = p.n_threads_batch = threads  # same threads, so batched vs serial timings compare
        p.flash_attn_type = FLASH_ATTN[flash]
        with captured_log() as log, held_signals() as pending:
            ctx = llama_cpp.llama_init_from_model(self._model, p)
            if pending:  # Ctrl-C came meanwhile: free what was made; the signal follows
                if ctx is not None:
                    llama_cpp.llama_free(ctx)
                llama_cpp.llama_model_free(self._model)
        if ctx is None:
            llama_cpp.llama_model_free(self._model)
            raise SpecmacError(f"llama.cpp cannot create a context for {path} ({first_error(log)}): "
                               "try a smaller n_ctx")
        said = [t for _, t in log if "flash attention" in t.lower() and "abled" in t]
        if flash == "auto" and said:
            flash = "on" if "enabled" in said[-1].lower() else "off"
        return ctx, flash

    @classmethod
    def devices(cls) -> list[str]:
        dev = gpu_offload()
        return ["cpu", dev] if dev else ["cpu"]

    @classmethod
    def variants(cls, model: str | None, role: str = "target") -> list[tuple[dict, str]]:
        """A .gguf file in its own type; an HF folder converted to F16; the embedded pair in every
        type it ships."""
        if model is None:
            from specmac import assets

            return [({"quant": q}, q.upper()) for q in assets.GGUF_TYPES]
        return [({}, gguf_type(model) if Path(model).suffix == ".gguf" else "F16")]

    @classmethod
    def source_name(cls, model: str | None, role: str = "target") -> str:
        return f"embedded {role}" if model is None else super().source_name(model, role)

    @classmethod
    def peek_vocab(cls, model: str | None, role: str = "target", **opts) -> Vocab:
        """The vocabulary alone (vocab_only load: no weights are read)."""
        path, _ = resolve_model(model, role, opts.get("quant"))
        model_p = load_model(path, vocab_only=True)
        try:
            return read_vocab(model_p)
        finally:
            llama_cpp.llama_model_free(model_p)

    def close(self) -> None:
        """Free the context, batch and model now (otherwise when the backend is collected)."""
        self._finalizer()

    # --- the contract --------------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return self._n_past

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits at every appended position: float32 [len(tokens), n_logits]."""
        tokens = self.check_tokens(tokens)
        rows = [self._decode(tokens[i : i + self._n_batch], all_logits=True)
                for i in range(0, len(tokens), self._n_batch)]
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens asking llama.cpp only for the last position's logits: float32 [n_logits]."""
        tokens = self.check_tokens(tokens)
        for i in range(0, len(tokens), self._n_batch):
            out = self._decode(tokens[i : i + self._n_batch], all_logits=False)
        return out[-1]

    def _decode(self, tokens: list[int], all_logits: bool) -> np.ndarray:
        """One llama_decode; -> float32 [n_out, n_logits], n_out = len(tokens) or 1."""
        b, n = self._batch, len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, self._n_past + i, 1, 0
            b.logits[i] = all_logits or i == n - 1
        b.n_tokens = n
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with status {rc} at n_past={self._n_past}")
        self._n_past += n
        n_out = n if all_logits else 1
        ptr = llama_cpp.llama_get_logits(self._ctx)  # the requested rows, in batch order
        return np.ctypeslib.as_array(ptr, shape=(n_out, self._n_vocab)).copy()

    def rewind(self, n_past: int) -> None:
        self.check_rewind(n_past)
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n_past, -1):
            raise RuntimeError(f"llama.cpp cannot truncate this model's cache to {n_past} (recurrent?)")
        self._n_past = n_past

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self._n_past = 0

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special tokens written in the text are parsed; BOS only if the model asks."""
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 2))()
        n = llama_cpp.llama_tokenize(self._vocab_p, data, len(data), buf, len(buf), False, True)
        if n < 0:
            buf = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(self._vocab_p, data, len(data), buf, len(buf), False, True)
        bos = [self.vocab.bos_id] if self._add_bos and self.vocab.bos_id is not None else []
        return bos + list(buf[:n])

    def decode(self, ids: Sequence[int]) -> str:
        """ids -> text (UTF-8, invalid bytes replaced); a leading BOS added by encode is dropped."""
        if ids:  # llama.cpp would abort on an id outside the vocabulary
            ids = [int(i) for i in ids]
            if min(ids) < 0 or max(ids) >= self._n_vocab:
                raise BadTokens(f"token ids must be in [0, {self._n_vocab})", param="ids")
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        size = max(64, 8 * len(ids))
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self._vocab_p, arr, len(ids), buf, size, True, False)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n
        raise RuntimeError("llama_detokenize failed")

    def apply_chat_template(self, prompt) -> str:
        """One user turn (or a list of messages) through the GGUF's tokenizer.chat_template."""
        template = llama_cpp.llama_model_chat_template(self._model, None)
        if not template:
            raise SpecmacError("chat: this GGUF has no tokenizer.chat_template: give the prompt without one",
                               param="chat")
        tb = self.vocab.token_bytes
        bos = tb[self.vocab.bos_id].decode(errors="replace") if self.vocab.bos_id is not None else ""
        eos_id = llama_cpp.llama_vocab_eos(self._vocab_p)
        eos = tb[eos_id].decode(errors="replace") if eos_id >= 0 else ""
        fmt = Jinja2ChatFormatter(template.decode(), eos_token=eos, bos_token=bos)
        text = fmt(messages=hf.chat_messages(prompt)).prompt
        if self._add_bos and bos and text.startswith(bos):
            text = text[len(bos):]  # encode adds BOS itself
        return text


def _release(model, ctx, batch) -> None:
    with captured_log():  # llama.cpp reports buffer sizes as it frees them
        _free(model, ctx, batch)


def _free(model, ctx, batch) -> None:
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


llama_cpp.llama_backend_init()  # once, on the first import (as Llama does); idempotent in llama.cpp
