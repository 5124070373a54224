"""Convert a GGUF model into a Hugging Face folder (for the mlx and torch backends).

    python bench/convert_gguf_to_hf.py ~/.cache/specmac/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        [~/.cache/specmac/models/qwen2.5-coder-0.5b-instruct-hf] [--dtype float32]

A thin wrapper over ``specmac.backends.conversion.convert.gguf_to_hf``, the converter the torch
and mlx backends use when given a .gguf file (transformers' GGUF loader; `pip install
'specmac[convert]'`): the folder is made once in specmac's cache (`specmac models` lists it)
and printed. With OUT it is also linked there (hard links, or a copy across file systems) for
scripts that want a fixed path.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path, nargs="?", help="also place the folder here")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = ap.parse_args()

    from specmac.backends.conversion.convert import gguf_to_hf

    folder, meta = gguf_to_hf(args.gguf, args.dtype)
    print(f"{folder}  (from {meta['source']}, sha256 {meta['source_sha256']})")
    if args.out:
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(folder, args.out, copy_function=_link_or_copy)
        print(f"linked into {args.out}")


if __name__ == "__main__":
    main()
