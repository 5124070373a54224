"""PyTorch via transformers: any causal LM in a Hugging Face folder (safetensors only) or a GGUF file
(dequantised once to the dtype, cached as a folder: specmac.backends.conversion.convert), cpu | mps | cuda.

The KV cache is a transformers ``DynamicCache``; rewinding crops it. Logits come back as float32
numpy rows, one per appended token.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AttentionInterface, AutoModelForCausalLM, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.utils import logging as hf_logging

from specmac.backends import MAX_CTX, MAX_THREADS, BaseBackend, Option, Saved, hf, tail_rows
from specmac.backends import threads as cpu_threads
from specmac.errors import BadOption, ModelNotFound, SpecmacError
from specmac.vocab import Vocab

# the "Loading weights" bar would interleave with streamed text and one-line errors
hf_logging.disable_progress_bar()

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_DEFAULT_CTX = 4096  # the default window; a KV cache beyond it is rarely what a laptop wants


def default_device() -> str:
    """The fastest device present: cuda, then mps, then cpu."""
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for every kernel queued on ``device`` (cpu work is already synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class TorchBackend(hf.HFFolderMixin, BaseBackend):
    name = "torch"
    library = "transformers"
    formats = ("hf", "gguf")  # an HF folder; a .gguf file is dequantised once (cached)
    converted_formats = ("gguf",)
    options = {
        "device": Option(str, None, "cpu, mps or cuda; default the first available of cuda, mps, cpu",
                         ("cpu", "mps", "cuda")),
        "dtype": Option(str, None, "compute dtype; default float32 on cpu, float16 on mps/cuda",
                        tuple(DTYPES)),
        "n_threads": Option(int, None, "torch CPU threads (process-wide); default torch's own",
                            lo=1, hi=MAX_THREADS),
        "trust_remote_code": Option(bool, False, "run modelling code shipped with the model"),
        "n_ctx": Option(int, None, f"context window; default max_position_embeddings, at most "
                                   f"{MAX_DEFAULT_CTX}", lo=2, hi=MAX_CTX),
    }

    def __init__(self, model: str | None = None, *, role: str = "target", **opts) -> None:
        o = {k: v.default for k, v in self.options.items()} | opts
        device, dtype = device_and_dtype(o)
        folder, converted = hf.resolve(model, role, dtype)
        if o["n_threads"] is not None:
            if o["n_threads"] < 1:
                raise BadOption(f"option n_threads={o['n_threads']} is out of range: use >= 1")
            torch.set_num_threads(o["n_threads"])
        # the user's count (or a GPU) is kept; torch's own default is fitted to the load (backends/threads.py)
        self._threads = None if o["n_threads"] is not None or device != "cpu" else \
            cpu_threads.Fitter(torch.get_num_threads(), self._set_threads)
        self.model_id, self.device = model or folder, torch.device(device)
        self.tokenizer = hf.load_tokenizer(folder, o["trust_remote_code"])
        self.model = load_model(folder, DTYPES[dtype], self.device, o["trust_remote_code"])
        config = self.model.config.get_text_config(decoder=True)
        self.n_ctx = context_window(config, o["n_ctx"])
        self.vocab = hf.vocab_from_tokenizer(self.tokenizer, config.vocab_size, hf.generation_eos_ids(folder))
        self._keep_arg = logits_to_keep_arg(self.model)
        self.cache: DynamicCache | None = new_cache(self.model)  # checks now that it can be rewound
        # one forward serves several lanes where the model attends through sdpa (its attention is
        # then taken lane by lane, ``lanes_attention``) and every cache layer is a plain attention
        # layer (no sliding window); read once (the planner asks at every width it weighs)
        self._can_batch = (self.model.config._attn_implementation == "sdpa"
                           and all(type(layer).__name__ == "DynamicLayer" for layer in self.cache.layers))
        self._n_past = 0
        self.resolved = {"device": device, "dtype": dtype, "n_threads": torch.get_num_threads(),
                         "trust_remote_code": o["trust_remote_code"], "n_ctx": self.n_ctx,
                         "logits_to_keep": self._keep_arg is not None}
        if converted:  # a GGUF file: say which folder was loaded and what it was made from
            self.resolved |= {"path": folder, "source_sha256": converted["source_sha256"]}

    def _set_threads(self, n: int) -> None:
        torch.set_num_threads(n)
        self.resolved["n_threads"] = n

    @classmethod
    def devices(cls) -> list[str]:
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (
            ["mps"] if torch.backends.mps.is_available() else [])

    @classmethod
    def peek_vocab(cls, model: str | None, role: str = "target", **opts) -> Vocab:
        """The vocabulary from the tokenizer files alone (no weights are read)."""
        dtype = device_and_dtype({"device": None, "dtype": None} | opts)[1]
        return hf.peek_vocab(model, role, opts.get("trust_remote_code", False), dtype)

    # --- the contract ---------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return self._n_past

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        return self._forward(tokens, keep=len(tokens))  # [n, n_logits]

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        return self._forward(tokens, keep=1)[-1]  # [n_logits]

    def _forward(self, tokens: Sequence[int], keep: int) -> np.ndarray:
        """The logits of the last ``keep`` positions (the model computes only those where it can)."""
        ids = self._check(tokens)
        if self.cache is None:
            self.cache = new_cache(self.model)
        kw = {self._keep_arg: keep} if keep < len(tokens) and self._keep_arg else {}
        def run():
            with torch.inference_mode():
                return self.model(input_ids=ids, cache=self.cache, use_cache=True, **kw)
        out = self._threads.timed(run) if self._threads else run()
        self._n_past += ids.shape[1]
        return out.logits[0, -keep:].float().cpu().numpy()

    def _check(self, tokens: Sequence[int]) -> torch.Tensor:
        tokens = self.check_tokens(tokens)
        return torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, n]

    def rewind(self, n_past: int) -> None:
        self.check_rewind(n_past)
        if n_past == 0:
            self.cache = None  # cheaper than cropping everything, and frees the memory
        elif n_past < self._n_past:
            self.cache.crop(n_past - self._n_past)  # transformers 5: a negative count removes tokens
        self._n_past = n_past

    def reset(self) -> None:
        self.rewind(0)

    can_save = True

    def save(self) -> Saved:
        """A copy of the past keys and values (a DynamicCache, cropped in place as the run goes)."""
        layers = self.cache.layers if self.cache is not None else []
        nbytes = sum(t.numel() * t.element_size() for layer in layers
                     for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None)
        return Saved(tuple(self.held or ()), copy.deepcopy(self.cache), nbytes)

    def restore(self, saved: Saved) -> None:
        self.cache = copy.deepcopy(saved.state)
        self._n_past = len(saved.tokens)

    def write_state(self, saved: Saved, stem: Path) -> Path:
        from safetensors.torch import save_file

        layers = saved.state.layers if saved.state is not None else []
        tensors = {f"{i}.{part}": getattr(layer, part).contiguous() for i, layer in enumerate(layers)
                   for part in ("keys", "values") if getattr(layer, part, None) is not None}
        path = stem.with_suffix(".safetensors")
        save_file(tensors, str(path))
        return path

    def read_state(self, path: Path, tokens: Sequence[int]) -> Saved:
        from safetensors.torch import load_file

        tensors = load_file(str(path), device=str(self.device))
        cache = new_cache(self.model) if tokens else None
        n = 0
        while f"{n}.keys" in tensors:
            cache.update(tensors[f"{n}.keys"], tensors[f"{n}.values"], n)
            n += 1
        return Saved(tuple(tokens), cache, sum(t.numel() * t.element_size() for t in tensors.values()))

    # --- several sequences: lanes with their own caches, their tokens in one forward -------------
    @property
    def can_batch(self) -> bool:  # type: ignore[override]
        return self._can_batch

    def lanes(self, n: int) -> list[BaseBackend]:
        out: list[BaseBackend] = [self]
        for _ in range(1, n):
            lane = copy.copy(self)  # the model and tokenizer are shared; the cache is its own
            lane.cache, lane._n_past, lane._held = None, 0, []
            out.append(lane)
        return out

    def score_many(self, asks):
        """Every ask's tokens in one forward, one after another in one row (as continuous batching
        packs them): the weights' matmuls over all of them at once, the attention each lane's own
        (its cache and its new tokens, ``lanes_attention``), so no token computes padding and a
        prompt's chunk goes in the same forward as the other lanes' steps."""
        work = [(lane, lane.check_tokens(tokens), rows) for lane, tokens, rows in asks]
        if len({id(w[0]) for w in work}) < len(work):
            raise ValueError("score_many: a lane appears twice in one pass")
        if len(work) == 1:
            lane, tokens, rows = work[0]
            n = tail_rows(rows, len(tokens))
            logits = lane._forward(tokens, keep=max(n, 1))
            return [logits if n else None]
        return self._forward_lanes(work)

    def _forward_lanes(self, work) -> list[np.ndarray | None]:
        ids, pos, spans, keep = [], [], [], []
        for lane, tokens, rows in work:
            a = len(ids)
            ids += tokens
            pos += range(lane._n_past, lane._n_past + len(tokens))
            if lane.cache is None:
                lane.cache = new_cache(self.model)
            n, m = len(tokens), lane._n_past + len(tokens)  # its new tokens; its keys after them
            # the causal mask of a span after a past, the same in every layer (none: one token, or
            # no past, where sdpa's own causal flag does it)
            mask = (None if n == 1 or m == n else torch.ones((n, m), dtype=torch.bool, device=self.device)
                    .tril(m - n)[None, None])
            spans.append((lane.cache, a, len(ids), mask))
            keep += range(len(ids) - tail_rows(rows, len(tokens)), len(ids))
        dev = self.device
        kw = {self._keep_arg: torch.tensor(keep or [len(ids) - 1], device=dev)} if self._keep_arg else {}
        config = self.model.config

        def run():
            was, config._attn_implementation = config._attn_implementation, LANES  # this forward only
            try:
                with torch.inference_mode():
                    return self.model(input_ids=torch.tensor([ids], device=dev),
                                      position_ids=torch.tensor([pos], device=dev), use_cache=False,
                                      specmac_lanes=spans, **kw)
            finally:
                config._attn_implementation = was
        try:
            out = self._threads.timed(run) if self._threads else run()
        except BaseException:
            for lane, _, _ in work:  # what the layers before the failure appended, layer by layer
                for layer in lane.cache.layers if lane._n_past else ():
                    if (extra := layer.get_seq_length() - lane._n_past) > 0:
                        layer.crop(-extra)
                if not lane._n_past:
                    lane.cache = None
            raise
        logits = out.logits[0].float().cpu().numpy()  # the rows kept, in order (else every row)
        rows, r = [], 0
        for (lane, tokens, want), (_, _, end, _) in zip(work, spans):
            lane._n_past += len(tokens)
            n = tail_rows(want, len(tokens))
            at = r if self._keep_arg else end - n
            rows.append(logits[at : at + n] if n else None)
            r += n
        return rows

    def sync(self) -> None:
        synchronize(self.device)

    def encode(self, text: str) -> list[int]:
        # the tokenizer's default special tokens, as transformers' text-generation pipeline uses; not
        # when the text already starts with BOS (a chat template wrote it), which would double it
        bos = self.tokenizer.bos_token
        return self.tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def apply_chat_template(self, prompt) -> str:
        return hf.apply_chat_template(self.tokenizer, prompt)


LANES = "specmac_lanes"  # the attention a forward over several lanes runs under


def lanes_attention(module, query, key, value, attention_mask, *, specmac_lanes=(), **kwargs):
    """Attention for a forward whose row holds several lanes' new tokens (``specmac_lanes``: each
    lane's cache, its tokens' span [a, b) of the row and its mask): each lane's keys and values go
    to its own cache, and its queries attend to that cache alone, through the kernel the lane's
    forward alone calls (sdpa)."""
    outs = []
    for cache, a, b, mask in specmac_lanes:
        k, v = cache.update(key[:, :, a:b], value[:, :, a:b], module.layer_idx)
        outs.append(sdpa_attention_forward(module, query[:, :, a:b], k, v, mask, **kwargs)[0])
    return torch.cat(outs, dim=1), None


AttentionInterface.register(LANES, lanes_attention)


def device_and_dtype(o: dict) -> tuple[str, str]:
    """The device and dtype options after defaults (float32 on cpu, float16 on mps/cuda)."""
    device = o["device"] or default_device()
    if device not in TorchBackend.devices():
        raise BadOption(f"option device={device} is not available here: use one of "
                        f"{', '.join(TorchBackend.devices())}")
    return device, o["dtype"] or ("float32" if device == "cpu" else "float16")


def load_model(folder: str, dtype: torch.dtype, device: torch.device, trust_remote_code: bool):
    """from_pretrained with safetensors only (pickle checkpoints can run code when loaded)."""
    path = Path(folder)
    if path.is_dir() and not any(path.glob("*.safetensors")):
        raise ModelNotFound(f"{folder} has no .safetensors weights: convert the checkpoint to safetensors "
                            "(pickled .bin/.pt files are not loaded)")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its loading report is ours to give, as one line
    try:
        # mismatched shapes come back in the report (instead of an error that names no tensor)
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code,
            output_loading_info=True, ignore_mismatched_sizes=True)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as e:
        # missing or inconsistent files, unknown architecture, remote code refused
        raise ModelNotFound(f"cannot load {folder} with transformers: {one_line(e)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_complete(folder, info)
    return model.to(device).eval()


def check_complete(folder: str, info: dict) -> None:
    """Every parameter of the architecture read from the checkpoint with its own shape, and nothing
    left over: transformers would initialise a missing tensor randomly and generate garbage."""
    files = ", ".join(p.name for p in sorted(Path(folder).glob("*.safetensors"))) or "the weights"
    problems = [(f"tensor {name} is missing", name) for name in sorted(info.get("missing_keys") or ())]
    problems += [(f"tensor {m[0]} has shape {tuple(m[1])} where the model needs {tuple(m[2])}", m[0])
                 for m in sorted(info.get("mismatched_keys") or (), key=str)]
    problems += [(f"tensor {name} is not part of the model", name)
                 for name in sorted(info.get("unexpected_keys") or ())]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelNotFound(f"{folder}/{files}: {problems[0][0]}{more}: the checkpoint does not match "
                            "config.json; use the model's complete files")


def one_line(e: Exception) -> str:
    text = str(e).strip()
    line = (text.splitlines() or [type(e).__name__])[0]
    if "trust_remote_code" in text:  # transformers puts its hint on a later line
        line += " Set the option trust_remote_code=true only if you trust that code."
    return line


def context_window(config, n_ctx: int | None) -> int:
    limit = getattr(config, "max_position_embeddings", None) or MAX_DEFAULT_CTX
    if n_ctx is None:
        return min(limit, MAX_DEFAULT_CTX)
    if not 2 <= n_ctx <= limit:
        raise BadOption(f"option n_ctx={n_ctx} is out of range: use 2..{limit} (max_position_embeddings)")
    return n_ctx


def logits_to_keep_arg(model) -> str | None:
    """The forward() keyword that limits the logits to the last rows, if this model has one."""
    params = inspect.signature(model.forward).parameters
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def new_cache(model) -> DynamicCache:
    """A DynamicCache laid out from the config; fails early if it cannot be rewound."""
    cache = DynamicCache(config=model.config)
    # sliding-window layers drop old states unless told to keep them until the next crop
    cache.activate_past_recording()
    if not cache.is_croppable:
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise SpecmacError(f"this model's cache ({', '.join(kinds)}) cannot be rewound, so it cannot "
                           "verify drafts: use a model with attention-only layers")
    return cache
