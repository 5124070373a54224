"""llama.cpp through llama-cpp-python's low-level API: the gguf backend, CPU or GPU offload (its
files: ``gguf_files``).

``score`` builds its own ``llama_batch`` and asks for logits at exactly the positions it returns (no
``logits_all``, which would reserve n_ctx x vocab floats); ``rewind`` removes KV entries with
``llama_memory_seq_rm``. llama.cpp's log is captured while loading, so a failure is one line.
Ctrl-C or SIGTERM during a long ``llama_decode`` (a prompt's prefill, the first decode) stops it
through llama.cpp's abort callback; the cache is put back as it was and the signal follows.
"""

from __future__ import annotations

import copy
import ctypes
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from specmac.backends import MAX_CTX, MAX_THREADS, BaseBackend, Option, Saved, chat_messages, tail_rows
from specmac.backends import threads as cpu_threads
from specmac.backends.gguf_files import (  # noqa: F401  (the backend's files, and its face for callers)
    ALL_LAYERS,
    FLASH_ATTN,
    FTYPES,
    GGUF_MAGIC,
    GGUF_TYPE,
    HUB_FILE,
    LOG_ERROR,
    QUANTS,
    captured_log,
    check_gguf,
    default_threads,
    extra_bufts_safe,
    file_type,
    first_error,
    gguf_type,
    gpu_offload,
    hub_file,
    load_model,
    read_vocab,
    requantize,
    resolve_model,
)
from specmac.backends.gguf_seq import chat_text, decodes, fill, get_state, release, set_state
from specmac.backends.interrupt import held_signals
from specmac.errors import BadOption, BadTokens, SpecmacError
from specmac.vocab import Vocab

# decodes of at least this many tokens (a prompt's prefill), and a context's first (cold) decode,
# can be stopped mid-way; shorter ones are not worth the callback's cost on every graph node
ABORTABLE_TOKENS = 32
DECODE_ABORTED = 2  # llama_decode's status when the abort callback said stop


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
        "n_threads": Option(int, None, "CPU threads for single-token and batched passes alike; default "
                                       "the physical cores, fewer where other work keeps CPUs busy",
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
        # the user's count is kept; the default one is fitted to the load (backends/threads.py)
        self._threads = None if o["n_threads"] or ngl else cpu_threads.Fitter(threads, self._set_threads)
        n_batch = min(o["n_batch"], self.n_ctx)
        self._ctx, flash = self._new_context(path, self.n_ctx, n_batch, threads, o["flash_attn"])
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        # the callback reads the signals held around the decode (none outside one); a list, not
        # self, so the callback keeps no backend alive; freed with the context it is set on
        self._stop: list = [()]
        self._abort_cb = llama_cpp.ggml_abort_callback(lambda _data, stop=self._stop: bool(stop[0]))
        self._finalizer = weakref.finalize(self, release, self._model, self._ctx, self._batch,
                                           self._abort_cb)
        self._cold = True
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.vocab = read_vocab(self._model)
        self._n_vocab = self.vocab.n_logits
        self._n_batch = n_batch
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab_p))
        self._n_past = 0
        self._seq, self._n_seq = 0, 1  # this lane's sequence id; the sequences the context holds
        self.resolved = {"path": path, "n_ctx": self.n_ctx, "n_ctx_train": n_train,
                         "n_threads": threads, "n_threads_batch": threads, "n_batch": n_batch,
                         "n_ubatch": n_batch, "n_gpu_layers": ngl, "flash_attn": flash,
                         "device": (gpu_offload() or "cpu") if ngl else "cpu", "add_bos": self._add_bos,
                         "extra_bufts": "on" if extra else "off"}
        if model is None or o["quant"] or converted:  # quant only where it chose what was loaded
            self.resolved["quant"] = o["quant"] or (converted or {}).get("quant") or "q8_0"
        if converted:
            self.resolved["source_sha256"] = converted["source_sha256"]

    def _new_context(self, path: str, n_ctx: int, n_batch: int, threads: int, flash: str, n_seq: int = 1):
        """-> the llama_context and the flash attention state ("on", "off"; "auto" if llama.cpp
        did not say what auto chose). ``n_seq`` sequences share one cache of n_ctx cells."""
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        p.kv_unified = n_seq > 1
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

    def _set_threads(self, n: int) -> None:
        with captured_log():  # llama.cpp says each new count on stderr: no library line reaches the user
            llama_cpp.llama_set_n_threads(self._ctx, n, n)
        self.resolved["n_threads"] = self.resolved["n_threads_batch"] = n

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
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, self._n_past + i, 1, self._seq
            b.logits[i] = all_logits or i == n - 1
        b.n_tokens = n
        long = n >= ABORTABLE_TOKENS or self._cold

        def decode() -> int:
            return self._decode_abortable(b) if long else llama_cpp.llama_decode(self._ctx, b)
        try:
            rc = self._threads.timed(decode) if self._threads else decode()
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with status {rc} at n_past={self._n_past}")
            self._n_past, self._cold = self._n_past + n, False
        except BaseException:  # what its ubatches left, or a signal between the decode and n_past
            llama_cpp.llama_memory_seq_rm(self._mem, self._seq, self._n_past, -1)
            raise
        n_out = n if all_logits else 1
        ptr = llama_cpp.llama_get_logits(self._ctx)  # the requested rows, in batch order
        return np.ctypeslib.as_array(ptr, shape=(n_out, self._n_vocab)).copy()

    def _decode_abortable(self, batch) -> int:
        """llama_decode with SIGINT/SIGTERM held and the abort callback set: a signal stops it at the
        next graph node (main thread only) and is raised, the cache back at n_past (not ubatches')."""
        if threading.current_thread() is not threading.main_thread():
            return llama_cpp.llama_decode(self._ctx, batch)
        while True:
            # the log too: an abort makes llama.cpp log four error lines, noise after a Ctrl-C
            with held_signals() as pending, captured_log() as log:
                self._stop[0] = pending
                llama_cpp.llama_set_abort_callback(self._ctx, self._abort_cb, None)
                try:
                    rc = llama_cpp.llama_decode(self._ctx, batch)
                finally:
                    self._stop[0] = ()
                    llama_cpp.llama_set_abort_callback(self._ctx, _NO_ABORT, None)
                if pending:  # stopped, or done as the signal came: as if never called
                    llama_cpp.llama_memory_seq_rm(self._mem, self._seq, self._n_past, -1)
                elif rc != 0:  # the caller puts the cache back
                    raise RuntimeError(f"llama_decode failed with status {rc} at n_past={self._n_past} "
                                       f"({first_error(log)})")
            if not pending:
                return rc
            # the signal's handler returned instead of raising (a server's SIGTERM drains the
            # requests in flight): this decode is still wanted

    can_save = True

    def save(self) -> Saved:
        """The sequence's state as llama.cpp serialises it (its cells of the KV cache)."""
        state = get_state(self._ctx, self._seq, self._n_past)
        return Saved(tuple(self.held or ()), state, len(state))

    def restore(self, saved: Saved) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, self._seq, -1, -1)
        self._n_past = 0
        if saved.tokens:
            set_state(self._ctx, self._seq, saved.state, len(saved.tokens))
            self._n_past = len(saved.tokens)

    def write_state(self, saved: Saved, stem: Path) -> Path:
        (path := stem.with_suffix(".llama-state")).write_bytes(saved.state)
        return path

    def read_state(self, path: Path, tokens: Sequence[int]) -> Saved:
        data = path.read_bytes()
        return Saved(tuple(tokens), data, len(data))

    def rewind(self, n_past: int) -> None:
        self.check_rewind(n_past)
        if not llama_cpp.llama_memory_seq_rm(self._mem, self._seq, n_past, -1):
            raise RuntimeError(f"llama.cpp cannot truncate this model's cache to {n_past} (recurrent?)")
        self._n_past = n_past

    def reset(self) -> None:
        if self._n_seq == 1:
            llama_cpp.llama_memory_clear(self._mem, True)
        else:  # the other lanes' sequences stay
            llama_cpp.llama_memory_seq_rm(self._mem, self._seq, -1, -1)
        self._n_past = 0

    # --- several sequences: lanes of one context, scored together in one llama_decode ------------
    can_batch = True

    def lanes(self, n: int) -> list[BaseBackend]:
        """n sequences of one context (llama.cpp's ``n_seq_max``, one unified cache of n x n_ctx
        cells, each sequence up to n_ctx), made anew where it holds fewer; each new lane starts
        empty, whatever an earlier lane of its sequence left (two pairs may share one backend)."""
        if n > self._n_seq:
            self._remake(n)
        out: list[BaseBackend] = [self]
        for i in range(1, n):
            lane = copy.copy(self)  # the model, context and batch are this backend's (and freed with it)
            lane._seq, lane._n_past, lane._held, lane._cold = i, 0, [], True
            llama_cpp.llama_memory_seq_rm(self._mem, i, -1, -1)
            out.append(lane)
        return out

    def _remake(self, n_seq: int) -> None:
        r = self.resolved
        ctx, _ = self._new_context(r["path"], self.n_ctx * n_seq, self._n_batch, r["n_threads"],
                                   r["flash_attn"] if r["flash_attn"] in FLASH_ATTN else "auto", n_seq)
        self._finalizer.detach()
        with captured_log():  # llama.cpp reports the buffers it frees
            llama_cpp.llama_free(self._ctx)
        self._ctx, self._mem, self._n_seq = ctx, llama_cpp.llama_get_memory(ctx), n_seq
        self._finalizer = weakref.finalize(self, release, self._model, ctx, self._batch, self._abort_cb)
        self._n_past, self._held, self._cold = 0, [], True

    def score_many(self, asks):
        """One llama_decode per n_batch tokens over every lane's tokens (a prompt's longer than
        n_batch over several): each token at its lane's position in its lane's sequence, logits
        asked for where its lane wants rows."""
        work = [(j, lane, lane.check_tokens(tokens), rows) for j, (lane, tokens, rows) in enumerate(asks)]
        if len({id(w[1]) for w in work}) < len(work):
            raise ValueError("score_many: a lane appears twice in one pass")
        out: list = [None] * len(work)
        parts: dict[int, list[np.ndarray]] = {j: [] for j, _, t, rows in work if tail_rows(rows, len(t))}
        for batch in decodes(work, self._n_batch):
            self._decode_many(batch, parts)
        for j, rows in parts.items():
            out[j] = rows[0] if len(rows) == 1 else np.concatenate(rows)
        return out

    def _decode_many(self, batch, parts: dict[int, list[np.ndarray]]) -> None:
        b = self._batch
        n = fill(b, batch)

        def decode() -> int:
            return llama_cpp.llama_decode(self._ctx, b)
        rc = self._threads.timed(decode) if self._threads else decode()
        if rc != 0:
            for _, lane, _, _ in batch:  # what its ubatches left
                llama_cpp.llama_memory_seq_rm(self._mem, lane._seq, lane._n_past, -1)
            raise RuntimeError(f"llama_decode failed with status {rc} on a batch of {n} tokens")
        ptr = llama_cpp.llama_get_logits(self._ctx)  # the requested rows, in batch order
        n_rows = sum(k for _, _, _, k in batch)
        logits = np.ctypeslib.as_array(ptr, shape=(n_rows, self._n_vocab)) if n_rows else None
        r = 0
        for j, lane, piece, k in batch:
            lane._n_past += len(piece)
            lane._cold = False
            if k:
                parts[j].append(logits[r : r + k].copy())
                r += k

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
        """One user turn, or messages, through the GGUF's tokenizer.chat_template, ready for generation."""
        template = llama_cpp.llama_model_chat_template(self._model, None)
        if not template:
            raise SpecmacError("chat: this GGUF has no tokenizer.chat_template: give the prompt without one",
                               param="chat")
        eos_id = llama_cpp.llama_vocab_eos(self._vocab_p)
        return chat_text(template.decode(), self.vocab, eos_id, self._add_bos, chat_messages(prompt))


_NO_ABORT = llama_cpp.ggml_abort_callback(0)  # NULL: llama.cpp's default, nothing checked


llama_cpp.llama_backend_init()  # once, on the first import (as Llama does); idempotent in llama.cpp
