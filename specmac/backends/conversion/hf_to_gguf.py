"""Write a Hugging Face folder (Llama or Qwen2, byte-level BPE tokenizer) as an F16 GGUF with gguf-py.

The training script of the embedded pair writes its GGUF files through this module too, so the
mapping below is checked byte for byte against the shipped F16 files. Weights are read from the
safetensors files through a memory map (float32, float16 or bfloat16; no torch needed) and written
one tensor at a time. Other architectures: llama.cpp's convert_hf_to_gguf.py.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from specmac.errors import ModelNotFound

ARCHS = {"llama": "llama", "qwen2": "qwen2"}  # HF model_type -> GGUF architecture
# llama.cpp's pre-tokenizer names, recognised by the Split regex of tokenizer.json
PRE_REGEX = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": "qwen2",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": "llama-bpe",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+": "gpt-2",
}
ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
LAYER = {  # HF name inside model.layers.N. -> GGUF name inside blk.N., in the order written
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def read_safetensors(folder: Path) -> dict[str, np.ndarray]:
    """name -> float32/float16 array (bfloat16 widened lazily by ``as_float``), memory-mapped."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            if t["dtype"] not in ST_DTYPES:
                raise ModelNotFound(f"{path.name}: tensor {name} is {t['dtype']}; only F32/F16/BF16 "
                                    "weights can be written as GGUF here")
            start, end = t["data_offsets"]
            dtype = np.dtype(ST_DTYPES[t["dtype"]])
            arr = np.memmap(path, dtype=dtype, mode="r", offset=8 + n + start,
                            shape=((end - start) // dtype.itemsize,))
            out[name] = (arr.reshape(t["shape"]), t["dtype"] == "BF16")
    if not out:
        raise ModelNotFound(f"{folder} has no .safetensors weights to write as GGUF")
    return out


def as_float(entry, dtype) -> np.ndarray:
    arr, bf16 = entry
    if bf16:  # bfloat16 is the top half of a float32
        arr = (np.asarray(arr, dtype=np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(np.asarray(arr).astype(dtype))


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF -> GGUF rotary layout for Q/K rows (llama.cpp's llama arch rotates adjacent pairs,
    HF rotates the two halves of each head): within each head, interleave the two halves."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


def tensors(cfg: dict, sd: dict) -> Iterator[tuple[str, str, type]]:
    """(HF name, GGUF name, dtype) in the order the GGUF holds them; norms and biases stay float32."""
    yield "model.embed_tokens.weight", "token_embd.weight", np.float16
    yield "model.norm.weight", "output_norm.weight", np.float32
    if "lm_head.weight" in sd and not cfg.get("tie_word_embeddings"):
        yield "lm_head.weight", "output.weight", np.float16
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, gg_name in LAYER.items():
            if f"model.layers.{i}.{hf_name}" in sd:
                dtype = np.float16 if gg_name.endswith("weight") and "norm" not in gg_name else np.float32
                yield f"model.layers.{i}.{hf_name}", f"blk.{i}.{gg_name}", dtype


def pre_tokenizer(tok_json: dict) -> str:
    pre = tok_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for s in steps:
        regex = (s.get("pattern") or {}).get("Regex") if s.get("type") == "Split" else None
        if regex in PRE_REGEX:
            return PRE_REGEX[regex]
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex"):
        return "gpt-2"
    raise ModelNotFound("this tokenizer's pre-tokenizer is not one specmac can name for llama.cpp "
                        f"({', '.join(PRE_REGEX.values())}): convert the folder with llama.cpp's "
                        "convert_hf_to_gguf.py")


def vocab(tok_json: dict, n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Token strings, GGUF token types and merges of a byte-level BPE tokenizer.json."""
    import gguf

    model = tok_json.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ModelNotFound("only byte-level BPE tokenizers (GPT-2 style) can be written as GGUF here: "
                            "convert this folder with llama.cpp's convert_hf_to_gguf.py")
    ids = dict(model["vocab"])
    added = {t["id"]: t for t in tok_json.get("added_tokens", [])}
    ids.update({t["content"]: i for i, t in added.items()})
    n = max(n_vocab, max(ids.values()) + 1)
    tokens, types = [f"[PAD{i}]" for i in range(n)], [gguf.TokenType.UNUSED] * n
    for text, i in ids.items():
        tokens[i] = text
        types[i] = (gguf.TokenType.UNUSED if text == f"[PAD{i}]"  # padding, as llama.cpp names it
                    else gguf.TokenType.NORMAL if i not in added else gguf.TokenType.CONTROL
                    if added[i].get("special") else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, [int(t) for t in types], merges


def write_gguf(folder: str | Path, out: str | Path, *, name: str | None = None,
               description: str | None = None, license: str | None = None) -> Path:
    """Write the model of ``folder`` as an F16 GGUF at ``out`` (norms and biases float32)."""
    import gguf

    folder, out = Path(folder), Path(out)
    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg | cfg.get("text_config", {})
    arch = ARCHS.get(cfg.get("model_type", ""))
    if arch is None:
        raise ModelNotFound(f"{folder}: model_type {cfg.get('model_type')!r} cannot be written as GGUF "
                            f"here (only {', '.join(ARCHS)}): use llama.cpp's convert_hf_to_gguf.py")
    if arch == "llama" and cfg.get("attention_bias"):
        raise ModelNotFound(f"{folder}: a llama model with attention biases is not supported here")
    tok_json = json.loads((folder / "tokenizer.json").read_text())
    pre = pre_tokenizer(tok_json)
    sd = read_safetensors(folder)
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name or folder.name)
    if description:
        w.add_description(description)
    if license:
        w.add_license(license)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    if arch == "llama":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    if arch == "llama":
        w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tokens, types, _ = vocab(tok_json, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens))
    special.add_to_gguf(w, quiet=True)

    plan = list(tensors(cfg, sd))
    missing = [h for h, _, _ in plan if h not in sd]
    if missing:
        raise ModelNotFound(f"{folder}: weights {', '.join(missing[:3])} are missing")

    def data(hf_name: str, dtype) -> np.ndarray:
        arr = as_float(sd[hf_name], dtype)
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            arr = np.ascontiguousarray(permute_qk(arr, n_head if "q_proj" in hf_name else n_kv))
        return arr

    for hf_name, gg_name, dtype in plan:  # tensor infos first, then the data one at a time
        shape = sd[hf_name][0].shape
        w.add_tensor_info(gg_name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for hf_name, _, dtype in plan:
        w.write_tensor_data(data(hf_name, dtype))
    w.close()
    return out
