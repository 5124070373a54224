"""MLX backend through mlx-lm: Hugging Face safetensors folders (or a GGUF file, converted once to a
cached folder: specmac.backends.conversion.convert) on Apple silicon (Metal) or the CPU.

The KV cache is mlx-lm's prompt cache; rewinding is ``trim_prompt_cache``, checked up front with
``can_trim_prompt_cache``. Each backend computes on its own stream, so a draft on the CPU and a
target on the GPU can share one process without touching mlx's global default device.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm.models.cache import (
    can_trim_prompt_cache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.utils import hf_repo_to_path

from specmac.backends import MAX_CTX, BaseBackend, Option, Saved, hf
from specmac.errors import BadOption, ModelNotFound, SpecmacError
from specmac.vocab import Vocab

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
MAX_DEFAULT_CTX = 4096  # default cap on the context window: a bigger cache costs memory up front
CTX_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length")


def pick_device(name: str | None) -> mx.Device:
    """Option value -> an mlx device; None is mlx's default (the GPU on Apple silicon)."""
    if name is None:
        return mx.default_device()
    device = mx.Device(mx.gpu if name == "gpu" else mx.cpu)
    if not mx.is_available(device):
        raise BadOption(f"option device={name} is not available to mlx on this machine: use device=cpu")
    return device


def check_trimmable(cache: list) -> None:
    """Speculation rewinds after every step, so a cache that cannot be trimmed is refused early."""
    if not can_trim_prompt_cache(cache):
        kinds = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        raise SpecmacError(f"this model's KV cache ({', '.join(kinds)}) cannot be rewound, so it cannot "
                           "be used for speculative decoding: pick a model with a plain attention cache")


def read_config(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    return cfg | cfg.get("text_config", {})  # multimodal configs nest the language model's fields


class MLXBackend(hf.HFFolderMixin, BaseBackend):
    name = "mlx"
    library = "mlx-lm"
    formats = ("hf", "gguf")  # an HF folder; a .gguf file is dequantised once (cached)
    converted_formats = ("gguf",)
    options = {
        "dtype": Option(str, None, "weights and activations; default float32 on the CPU, float16 on "
                        "the GPU", choices=tuple(DTYPES)),
        "device": Option(str, None, "cpu or gpu; default mlx's default device", choices=("cpu", "gpu")),
        "n_ctx": Option(int, None, f"context window in tokens; default the model's, at most "
                        f"{MAX_DEFAULT_CTX}", lo=2, hi=MAX_CTX),
    }

    def __init__(self, model: str | None = None, *, role: str = "target", dtype: str | None = None,
                 device: str | None = None, n_ctx: int | None = None) -> None:
        dev = pick_device(device)
        on_gpu = dev.type == mx.gpu
        dtype = dtype or ("float16" if on_gpu else "float32")
        source, converted = hf.resolve(model, role, dtype)
        self._device, self._local = dev, threading.local()
        self.model, wrapper = load_mlx(source)
        folder = Path(source) if Path(source).is_dir() else hf_repo_to_path(source)
        cfg = read_config(folder)
        self.model.set_dtype(DTYPES[dtype])
        mx.eval(self.model.parameters())
        self.tokenizer = wrapper._tokenizer  # the transformers tokenizer mlx-lm wraps
        self._n_embed = int(cfg.get("vocab_size") or len(self.tokenizer))
        self.vocab: Vocab = hf.vocab_from_tokenizer(self.tokenizer, self._n_embed,
                                                    hf.generation_eos_ids(str(folder)))
        self.n_ctx = context_window(cfg, n_ctx)
        self.model_id = source
        self.resolved = {"dtype": dtype, "device": "gpu" if on_gpu else "cpu", "n_ctx": self.n_ctx}
        if converted:  # a GGUF file: say which folder was loaded and what it was made from
            self.resolved |= {"path": source, "source_sha256": converted["source_sha256"]}
        self.reset()

    @classmethod
    def peek_vocab(cls, model: str | None, role: str = "target", **opts) -> Vocab:
        """The vocabulary without loading weights (options do not change it; a GGUF file is
        converted first, to the dtype the backend will load)."""
        dtype = opts.get("dtype") or ("float16" if pick_device(opts.get("device")).type == mx.gpu
                                      else "float32")
        return hf.peek_vocab(model, role, dtype=dtype)

    @classmethod
    def devices(cls) -> list[str]:
        return ["cpu"] + (["gpu"] if mx.is_available(mx.gpu) else [])

    # --- the contract ---------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return self._n_past

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """One forward pass over ``tokens`` appended to the cache: float32 [len(tokens), n_logits]."""
        tokens = self.check_tokens(tokens, self._n_embed)
        with mx.stream(self._stream()):
            logits = self.model(mx.array([tokens]), cache=self._cache)[0].astype(mx.float32)
            mx.eval(logits)
        self._n_past += len(tokens)
        out = np.array(logits)  # [len(tokens), model width]
        if out.shape[1] < self.vocab.n_logits:  # tokenizer ids beyond the embedding never win
            out = np.pad(out, ((0, 0), (0, self.vocab.n_logits - out.shape[1])), constant_values=-np.inf)
        return out

    def rewind(self, n_past: int) -> None:
        self.check_rewind(n_past)
        n = self._n_past - n_past
        if n and trim_prompt_cache(self._cache, n) != n:  # a rotating cache past its window
            raise SpecmacError(f"the KV cache ({type(self._cache[0]).__name__}) cannot rewind {n} tokens "
                               f"at {self._n_past}: use a smaller n_ctx")
        self._n_past = n_past

    def reset(self) -> None:
        self._cache = make_prompt_cache(self.model)
        check_trimmable(self._cache)
        self._n_past = 0

    def lanes(self, n: int) -> list[BaseBackend]:
        """Sequences with their own caches on the same weights; scored one after another (mlx-lm's
        batched caches place a sequence at shifted positions, which changes its rows)."""
        out: list[BaseBackend] = [self]
        for _ in range(1, n):
            lane = copy.copy(self)
            lane._held = []
            lane.reset()
            out.append(lane)
        return out

    can_save = True

    def save(self) -> Saved:
        """A copy of mlx-lm's caches (as its own prompt cache keeps them)."""
        return Saved(tuple(self.held or ()), copy.deepcopy(self._cache), sum(c.nbytes for c in self._cache))

    def restore(self, saved: Saved) -> None:
        self._cache = copy.deepcopy(saved.state)
        self._n_past = len(saved.tokens)

    def write_state(self, saved: Saved, stem: Path) -> Path:
        path = stem.with_suffix(".safetensors")
        save_prompt_cache(str(path), saved.state)  # mlx-lm's own format: safetensors
        return path

    def read_state(self, path: Path, tokens: Sequence[int]) -> Saved:
        cache = load_prompt_cache(str(path))
        return Saved(tuple(tokens), cache, sum(c.nbytes for c in cache))

    def sync(self) -> None:
        mx.synchronize(self._stream())

    def _stream(self):
        """This backend's stream on the calling thread: mlx streams belong to the thread that made
        them, and a server's worker thread uses a pair loaded on the main thread."""
        stream = getattr(self._local, "stream", None)
        if stream is None:  # thread-local, not keyed by thread id: a new thread can reuse an old one's id
            stream = self._local.stream = mx.new_stream(self._device)
        return stream

    def encode(self, text: str) -> list[int]:
        # as mlx_lm.generate: add BOS unless the text (e.g. from a chat template) starts with it
        bos = self.tokenizer.bos_token
        return list(self.tokenizer.encode(text, add_special_tokens=bos is None or not text.startswith(bos)))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, prompt) -> str:
        return hf.apply_chat_template(self.tokenizer, prompt)


def load_mlx(source: str):
    """mlx_lm.load with its file and format errors turned into one-line ModelNotFound."""
    path = Path(source)
    if path.is_dir() and not any(path.glob("model*.safetensors")):
        raise ModelNotFound(f"{source} has no model*.safetensors weights: mlx-lm loads Hugging Face "
                            "folders with safetensors weights")
    try:
        return mlx_lm.load(source)
    except (OSError, ValueError, KeyError, TypeError) as e:  # e.g. "Missing 1 parameters: \n<names>"
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise ModelNotFound(f"mlx-lm cannot load {source}: {text[:300]}") from None


def context_window(cfg: dict, n_ctx: int | None) -> int:
    """The requested window, checked against the model's; default the model's, capped."""
    model_max = next((int(cfg[k]) for k in CTX_KEYS if cfg.get(k)), None)
    if n_ctx is None:
        return min(model_max or MAX_DEFAULT_CTX, MAX_DEFAULT_CTX)
    if n_ctx < 2 or (model_max and n_ctx > model_max):
        raise BadOption(f"option n_ctx={n_ctx} is out of range: use 2..{model_max or 'any'}")
    return n_ctx
