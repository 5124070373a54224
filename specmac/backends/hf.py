"""Hugging Face folders shared by the mlx and torch backends: model resolution and vocabularies.

Imports transformers lazily (inside functions) so that it can be used by both backends without
importing one framework for the other.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from specmac.backends.conversion.hf_check import check_folder, check_hub, read_json
from specmac.errors import ModelNotFound
from specmac.vocab import Vocab

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
PAD_PIECE = re.compile(r"\[PAD\d+\]")


def resolve_model(model: str | None, role: str, dtype: str = "float32") -> str:
    """None -> the embedded pair's folder; a local folder (must hold config.json); a GGUF file
    (converted once to a folder of ``dtype`` weights, cached); or a hub id."""
    return resolve(model, role, dtype)[0]


def resolve(model: str | None, role: str, dtype: str = "float32") -> tuple[str, dict | None]:
    """-> (folder or hub id, the conversion's sidecar when the model was a GGUF file, else None)."""
    if model is not None and Path(model).expanduser().is_file():
        from specmac.backends.conversion import convert

        if convert.is_gguf(model):
            folder, meta = convert.gguf_to_hf(model, dtype)
            return str(folder), meta
    return _resolve_folder(model, role), None


def _resolve_folder(model: str | None, role: str) -> str:
    if model is None:
        from specmac import assets

        folder = assets.hf_dir(role)
        if not (folder / "config.json").is_file():
            raise ModelNotFound(f"the embedded {role} model is missing from {folder}: reinstall specmac "
                                "or pass a model")
        check_folder(folder)
        return str(folder)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{model} has no config.json: point at a Hugging Face model folder "
                                "(config.json + *.safetensors + tokenizer files)")
        check_folder(path)
        return str(path)
    if path.exists():
        raise ModelNotFound(f"{model} is neither a model folder nor a GGUF file: point at a Hugging Face "
                            "folder or a .gguf file")
    if HUB_ID.match(model) and not model.startswith((".", "~")):
        check_hub(model)  # cached, or reachable within seconds
        return model  # a hub id; downloaded by the library
    raise ModelNotFound(f"model {model} not found: give an existing folder or a hub id like org/name")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """The GPT-2 byte-level table: printable bytes map to themselves, the rest to 256+n."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _is_byte_level(tokenizer) -> bool:
    spec = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    decoders = spec.get("decoders", [spec]) if spec.get("type") == "Sequence" else [spec]
    return any(d.get("type") == "ByteLevel" for d in decoders)


def _piece_bytes(piece: str, byte_level: bool) -> bytes:
    if byte_level:
        table = _unicode_to_byte()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode()  # an added token written in plain text
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    return bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode()


def vocab_from_tokenizer(tokenizer, n_logits: int, extra_eos: tuple[int, ...] = ()) -> Vocab:
    """A transformers fast tokenizer -> Vocab (see specmac.vocab for the token-bytes rule)."""
    byte_level = _is_byte_level(tokenizer)
    n = len(tokenizer)
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    token_bytes = [(p or "").encode() if i in special else _piece_bytes(p or "", byte_level)
                   for i, p in enumerate(pieces)]
    eos = {tokenizer.eos_token_id, *extra_eos} - {None}
    # padded vocabulary rows, named like llama.cpp's converter names them
    unused = frozenset(i for i, p in enumerate(pieces) if p and PAD_PIECE.fullmatch(p))
    return Vocab(token_bytes, eos_ids=frozenset(eos), bos_id=tokenizer.bos_token_id,
                 special_ids=frozenset(special), n_logits=max(n_logits, n), unused_ids=unused)


def generation_eos_ids(folder: str) -> tuple[int, ...]:
    """EOS ids listed in generation_config.json (chat models often list several)."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return ()
    eos = read_json(path).get("eos_token_id")
    return tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def load_tokenizer(model: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, KeyError) as e:  # missing, unreadable or inconsistent files
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelNotFound(f"cannot load a tokenizer from {model}: {first}") from None


def peek_vocab(model: str | None, role: str = "target", trust_remote_code: bool = False,
               dtype: str = "float32") -> Vocab:
    """The vocabulary of a HF model without loading its weights (a GGUF file is converted first)."""
    folder = resolve_model(model, role, dtype)
    tok = load_tokenizer(folder, trust_remote_code)
    n_logits = 0
    config = Path(folder) / "config.json"
    if config.is_file():
        cfg = read_json(config)
        n_logits = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size") or 0
    return vocab_from_tokenizer(tok, n_logits, generation_eos_ids(folder))


def chat_messages(prompt) -> list[dict]:
    """A prompt as chat messages: a string is one user turn; a list of messages is kept."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def apply_chat_template(tokenizer, prompt) -> str:
    from specmac.errors import SpecmacError

    if not getattr(tokenizer, "chat_template", None):
        raise SpecmacError("chat: this model has no chat template: give the prompt without one", param="chat")
    return tokenizer.apply_chat_template(chat_messages(prompt), tokenize=False,
                                         add_generation_prompt=True)


DTYPES = ("float32", "bfloat16")  # the precisions advise tries an HF model in on torch and mlx


class HFFolderMixin:
    """What torch and mlx share as HF-folder backends: the dtypes a model runs in, the embedded
    pair's folders as its default model."""

    @classmethod
    def variants(cls, model: str | None, role: str = "target") -> list[tuple[dict, str]]:
        return [({"dtype": d}, d) for d in DTYPES]

    @classmethod
    def source_name(cls, model: str | None, role: str = "target") -> str:
        return f"embedded {role}" if model is None else super().source_name(model, role)

    @classmethod
    def default_files(cls, role: str = "target") -> list[str]:
        from specmac import assets

        return [str(assets.hf_dir(role))]
