"""A local Hugging Face folder is refused unless complete, before any framework reads it: readable
JSON configs, a tokenizer, and safetensors files whose headers parse and whose tensors lie within
the file (truncated downloads, a GGUF renamed to .safetensors). One ModelNotFound line each,
naming the file and what is wrong. Which tensors the architecture needs is the backend's check
(torch: transformers' loading report; mlx: strict loading)."""

from __future__ import annotations

import json
from pathlib import Path

from specmac.errors import ModelNotFound

# any one of these is a tokenizer transformers can load
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
MAX_HEADER = 100 << 20  # safetensors caps its JSON header at 100 MB


def check_folder(folder: Path) -> None:
    cfg = read_json(folder / "config.json")
    if not isinstance(cfg.get("model_type"), str):
        raise ModelNotFound(f"{folder / 'config.json'} has no model_type: it is not a transformers config")
    if (folder / "generation_config.json").exists():
        read_json(folder / "generation_config.json")
    weights = sorted(folder.glob("*.safetensors"))
    for path in weights:
        check_safetensors(path)
    # a folder without weights at all gets the backend's own message (what it loads instead)
    if weights and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFound(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}): copy the model's "
                            "tokenizer files into the folder")


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; anything else is a one-line ModelNotFound naming the file."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ModelNotFound(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ModelNotFound(f"{path} is not UTF-8 (byte {e.start}): replace it with the model's own "
                            "file") from None
    except json.JSONDecodeError as e:
        raise ModelNotFound(f"{path} is not valid JSON ({e.msg}, line {e.lineno}): replace it with the "
                            "model's own file") from None
    if not isinstance(data, dict):
        raise ModelNotFound(f"{path} is not a JSON object: replace it with the model's own file")
    return data


def check_safetensors(path: Path) -> None:
    """The header parses and every tensor's bytes lie within the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if head[:4] == b"GGUF":
            raise ModelNotFound(f"{path} is a GGUF file, not safetensors: give the file itself with a "
                                ".gguf name")
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= n <= min(size - 8, MAX_HEADER):
            raise ModelNotFound(f"{path} is not a safetensors file (or is truncated): its header length "
                                "does not fit the file; download it again")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ModelNotFound(f"{path} has an unreadable safetensors header: download it again") from None
    if not isinstance(header, dict):
        raise ModelNotFound(f"{path} has an unreadable safetensors header: download it again")
    need = 8 + n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = t["data_offsets"]
            need = max(need, 8 + n + int(end))
        except (TypeError, KeyError, ValueError):
            raise ModelNotFound(f"{path}: tensor {name} has no valid data_offsets: download it "
                                "again") from None
    if need > size:
        raise ModelNotFound(f"{path} is truncated: {size} bytes where its header describes {need}; "
                            "download it again")


HUB_TIMEOUT_S = 3.0


def check_hub(repo_id: str, filename: str = "config.json") -> None:
    """Before a hub download: a file already in the local cache loads offline; otherwise the hub
    must answer within seconds, or one ModelNotFound line says so (instead of a minute of retries)."""
    import os
    import socket
    from urllib.parse import urlparse

    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return  # the library that downloads reports its own requirement
    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelNotFound(f"{repo_id} is not in the local hub cache and HF_HUB_OFFLINE is set: give a "
                            "local folder or .gguf file")
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443),
                                 timeout=HUB_TIMEOUT_S).close()
    except OSError:
        raise ModelNotFound(f"cannot reach {url.hostname} to download {repo_id} (no network?) and it is "
                            "not in the local cache: give a local folder or .gguf file") from None
