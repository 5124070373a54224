"""Per-token cost of greedy decoding through the torch backend vs transformers' own generate.

Both decode the same new tokens with the same model object: the backend as a prefill plus a
``score([t])`` loop (numpy logits, argmax in numpy), transformers with ``model.generate`` (greedy,
EOS ignored). Prints JSON; the ratio is backend time / generate time (1.0 = no overhead).

    python bench/backend_overhead_torch.py [--model FOLDER] [--device cpu] [--dtype float32] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np
import torch

from specmac import assets
from specmac.backends import library_version, load_backend

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def backend_greedy(b, prompt: list[int], n_new: int) -> list[int]:
    b.reset()
    logits = b.prefill(prompt)  # [n_logits]
    out = []
    for _ in range(n_new):
        out.append(int(np.argmax(logits)))
        logits = b.score(out[-1:])[0]
    return out


def generate_greedy(b, prompt: list[int], n_new: int) -> list[int]:
    ids = torch.tensor([prompt], device=b.device)
    with torch.inference_mode():
        seq = b.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=0)
    return seq[0, len(prompt):].tolist()


def timed(fn, b, repeats: int) -> tuple[float, list[int]]:
    """Median seconds of ``repeats`` runs after one warm-up, and the tokens of the last run."""
    fn()
    times = []
    for _ in range(repeats):
        b.sync()
        t0 = time.perf_counter()
        out = fn()
        b.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF folder; default the embedded target")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (both sides)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.model is None and not (assets.hf_dir("target") / "config.json").is_file():
        ap.error("the embedded target is not built yet: pass --model FOLDER")
    given = {"device": args.device, "dtype": args.dtype, "n_threads": args.threads}
    opts = {k: v for k, v in given.items() if v is not None}
    b = load_backend("torch", args.model, opts, role="target")
    prompt = b.encode(PROMPT)
    t_backend, ours = timed(lambda: backend_greedy(b, prompt, args.new_tokens), b, args.repeats)
    t_generate, theirs = timed(lambda: generate_greedy(b, prompt, args.new_tokens), b, args.repeats)
    n = args.new_tokens
    print(json.dumps({
        "model": b.model_id, "options": b.resolved, "prompt_tokens": len(prompt), "new_tokens": n,
        "repeats": args.repeats, "backend_ms_per_token": round(1e3 * t_backend / n, 3),
        "generate_ms_per_token": round(1e3 * t_generate / n, 3), "ratio": round(t_backend / t_generate, 3),
        "same_tokens": ours == theirs, "torch": torch.__version__,
        "transformers": library_version("transformers"), "machine": platform.machine(),
        "python": platform.python_version()}, indent=2))


if __name__ == "__main__":
    main()
