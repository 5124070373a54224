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
import torch.nn.functional as F  # noqa: N812  (torch's own name for it)
from transformers import AutoModelForCausalLM, DynamicCache
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

    # --- several sequences: lanes with their own caches, scored together in one padded forward --
    @property
    def can_batch(self) -> bool:  # type: ignore[override]
        """Padding works where every cache layer is a plain attention layer (no sliding window)."""
        return all(type(layer).__name__ == "DynamicLayer" for layer in new_cache(self.model).layers)

    def lanes(self, n: int) -> list[BaseBackend]:
        out: list[BaseBackend] = [self]
        for _ in range(1, n):
            lane = copy.copy(self)  # the model and tokenizer are shared; the cache is its own
            lane.cache, lane._n_past, lane._held = None, 0, []
            out.append(lane)
        return out

    def score_many(self, asks):
        """Asks of similar length in one forward (the past left-padded, the new tokens right-padded,
        an attention mask and each sequence's own positions); a much longer one (a prompt's chunk)
        alone, as ``score`` would take it."""
        work = [(j, lane, lane.check_tokens(tokens), rows) for j, (lane, tokens, rows) in enumerate(asks)]
        if len({id(w[1]) for w in work}) < len(work):
            raise ValueError("score_many: a lane appears twice in one pass")
        out: list = [None] * len(work)
        for group in pad_groups(work):
            if len(group) == 1:
                j, lane, tokens, rows = group[0]
                n = tail_rows(rows, len(tokens))
                logits = lane._forward(tokens, keep=max(n, 1))
                out[j] = logits if n else None
            else:
                for (j, _, tokens, rows), logits in zip(group, self._forward_padded(group)):
                    out[j] = logits if tail_rows(rows, len(tokens)) else None
        return out

    def forwards(self, widths):
        """One padded forward per group ``score_many`` makes (asks x the group's longest tokens):
        asks of unlike widths (one stream drafting, the others not) cost two forwards, not one."""
        return [len(g) * g[0] for g in pad_groups(list(widths), size=lambda n: n)]

    def _forward_padded(self, group) -> list[np.ndarray]:
        lanes = [lane for _, lane, _, _ in group]
        past = [lane._n_past for lane in lanes]
        P, L, B = max(past), max(len(t) for _, _, t, _ in group), len(group)
        ids = torch.zeros((B, L), dtype=torch.long, device=self.device)
        mask = torch.zeros((B, P + L), dtype=torch.long, device=self.device)
        pos = torch.zeros((B, L), dtype=torch.long, device=self.device)
        for b, (_, _, tokens, _) in enumerate(group):
            ids[b, : len(tokens)] = torch.tensor(tokens, device=self.device)
            mask[b, P - past[b] : P + len(tokens)] = 1
            pos[b] = past[b] + torch.arange(L, device=self.device)
        cache = new_cache(self.model)
        held = [lane.cache.layers if n else None for lane, n in zip(lanes, past)]
        for i in range(len(cache.layers) if P else 0):  # each lane's past, left-padded to P
            empty = next(h[i].keys for h in held if h is not None)[:, :, :0]
            keys = [F.pad(h[i].keys if h else empty, (0, 0, P - n, 0)) for h, n in zip(held, past)]
            values = [F.pad(h[i].values if h else empty, (0, 0, P - n, 0)) for h, n in zip(held, past)]
            cache.update(torch.cat(keys), torch.cat(values), i)
        # the positions whose logits some ask wants (each ask's last ones): one span for the batch
        want = [(len(t) - tail_rows(rows, len(t)), len(t)) for _, _, t, rows in group]
        asked = [(a, b) for a, b in want if a < b] or [(L - 1, L)]
        lo, hi = min(a for a, _ in asked), max(b for _, b in asked)
        kw = {self._keep_arg: torch.arange(lo, hi, device=self.device)} if self._keep_arg else {}

        def run():
            with torch.inference_mode():
                return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache,
                                  use_cache=True, **kw)
        out = self._threads.timed(run) if self._threads else run()
        logits = out.logits.float().cpu().numpy()
        lo = lo if kw else 0  # where the logits returned start
        rows = []
        for b, (_, lane, tokens, _) in enumerate(group):
            n = len(tokens)
            if lane.cache is None:
                lane.cache = new_cache(self.model)
            for i, layer in enumerate(cache.layers):
                new = slice(P, P + n)
                lane.cache.update(layer.keys[b : b + 1, :, new], layer.values[b : b + 1, :, new], i)
            lane._n_past += n
            rows.append(logits[b, want[b][0] - lo : n - lo])
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


PAD_WASTE = 1.5  # a forward over padded asks computes at most this many times their real tokens


def pad_groups(work: list, size=lambda w: len(w[2])) -> list[list]:
    """Asks (j, lane, tokens, rows) in groups scored together: from the longest down, an ask joins
    the group while the padded forward (asks x the longest) stays within ``PAD_WASTE`` of their
    tokens. ``size``: an ask's token count."""
    groups: list[list] = []
    for w in sorted(work, key=lambda w: -size(w)):
        g = groups[-1] if groups else None
        if g is not None and (len(g) + 1) * size(g[0]) <= PAD_WASTE * sum(size(x) for x in [*g, w]):
            g.append(w)
        else:
            groups.append([w])
    return groups


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
