"""Convert a GGUF model into a Hugging Face folder (for the mlx and torch backends).

    python bench/convert_gguf_to_hf.py ~/.cache/specmac/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        ~/.cache/specmac/models/qwen2.5-coder-0.5b-instruct-hf --dtype float32

Uses transformers' GGUF loader (dequantizes to the given dtype; needs the `gguf` and `accelerate`
packages). The result is safetensors + config + tokenizer; keep it outside the repository.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, args.dtype)
    folder, name = str(args.gguf.parent), args.gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    (args.out / "specmac_source.json").write_text(json.dumps({"gguf": str(args.gguf),
                                                               "dtype": args.dtype}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
