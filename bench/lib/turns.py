"""A prompt in pieces against one piece, on the real models: the round-off a reused cache brings.

    python bench/losslessness.py turns [--models-dir DIR] [--targets gguf-f16,torch-fp32] --out OUT

A conversation's next turn processes only its new tokens (the caches hold the rest), so its rows
are computed with the past in pieces where a run from empty caches computes them in one. For each
target at full precision (the 1.5B as an F16 GGUF file; the torch folder read in fp32):

1. the rounding itself: the target's rows for a few tokens after a ~700-token prompt processed in
   two pieces (split at several points) against one piece, and a batched pass against one-token
   passes, as the largest absolute difference of the logits and whether the argmax moved;
2. ``specmac verify --exact --turns``: conversations whose turns reuse the caches (the 0.5B Q4_K_M
   draft, K = 4, the coupled sampler at T = 1) against plain decoding from empty caches, each
   parting diagnosed (a near-tie flip of round-off, or a pipeline error).

OUT/results.json (provenance and both measurements per target) and OUT/README.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from lib.machine import take_machine
from lib.models import QWEN_05B_GGUF, QWEN_15B_BF16, QWEN_15B_F16, add_models_dir
from specmac.api import Pair
from specmac.backends import load_backend
from specmac.compare.results import provenance, write_json
from specmac.core.drafters import ModelDrafter
from specmac.core.sampling import SamplingParams
from specmac.lossless.exact import exact_check

TARGETS = {"gguf-f16": ("gguf", QWEN_15B_F16, {}),
           "torch-fp32": ("torch", QWEN_15B_BF16, {"dtype": "float32"})}  # the bf16 folder read in fp32
TEXT = Path(__file__).resolve().parents[2] / "specmac" / "core" / "loop.py"  # code, as users' prompts hold
ROWS = 6  # rows compared after the prompt


def rounding(target, ids: list[int]) -> dict:
    """The rows of ROWS tokens after ids[:cut], the past in one piece / in two / one token a pass."""
    cut = len(ids) - ROWS - 4

    def rows(pieces: list[tuple[int, int]], serial: bool = False) -> np.ndarray:
        target.reset()
        for a, b in pieces:
            target.prefill(ids[a:b])
        new = ids[cut:cut + ROWS]
        if serial:
            return np.concatenate([np.asarray(target.score([t]), dtype=np.float64) for t in new])
        return np.asarray(target.score(new), dtype=np.float64)

    whole = rows([(0, cut)])
    out = {"prompt_tokens": cut, "rows": ROWS, "pieces": []}
    for split in sorted({cut // 2, cut - 37, cut - 5}):
        other = rows([(0, split), (split, cut)])
        out["pieces"].append({"split": split, "max_abs_logits": float(np.abs(other - whole).max()),
                              "argmax_moved": int((other.argmax(1) != whole.argmax(1)).sum())})
    serial = rows([(0, cut)], serial=True)
    out["batched_vs_serial"] = {"max_abs_logits": float(np.abs(serial - whole).max()),
                                "argmax_moved": int((serial.argmax(1) != whole.argmax(1)).sum())}
    target.reset()
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/losslessness.py turns", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: " + ", ".join(TARGETS))
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    command = shlex.join(["python", "bench/losslessness.py", "turns", *argv])
    take_machine(command)
    d, out, results = Path(args.models_dir), Path(args.out), []
    for name in args.targets.split(","):
        backend, file, opts = TARGETS[name]
        t0 = time.perf_counter()
        target = load_backend(backend, str(d / file), opts, role="target")
        ids = target.encode(TEXT.read_text())[:720]
        res = {"target": name, "file": file, "options": opts, "rounding": rounding(target, ids)}
        draft = load_backend("gguf", str(d / QWEN_05B_GGUF), None, role="draft")
        pair = Pair(target, [ModelDrafter(draft)])
        ex = exact_check(pair, params=SamplingParams(1.0, sampler="coupled"), k=4, length=args.length,
                         n_sequences=args.conversations * args.turns, turns=args.turns)
        keep = ("n_sequences", "turns", "length", "n_identical", "n_near_tie_flips", "n_failures", "partings",
                "sequences", "n_by_kind")
        res["exact"] = {k: ex[k] for k in keep}
        res["seconds"] = time.perf_counter() - t0
        res["provenance"] = provenance(models=[str(d / file), str(d / QWEN_05B_GGUF)]) | {"command": command}
        results.append(res)
        write_json(out / "results.json", {"results": results})
        (out / "README.md").write_text(readme(results, command))
        print(f"{name}: {ex['n_identical']} of {ex['n_sequences']} identical, {ex['n_failures']} failures, "
              f"{res['seconds']:.0f} s", file=sys.stderr)


def readme(results: list[dict], command: str) -> str:
    prov = results[0]["provenance"]
    lines = ["# A prompt in pieces against one piece, on the real models", "",
             f"`{command}`", "",
             f"{prov['machine']['processor']}; commit {prov['git_sha']}. The 1.5B target "
             "at full precision; bench/lib/turns.py says what each column is.", "",
             "| target | prompt | pieces against one piece: max abs logits (split at) | batched against "
             "one-token passes | argmax moved | verify --exact --turns: identical | near-tie flips | "
             "failures |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ro, ex = r["rounding"], r["exact"]
        pieces = ", ".join(f"{p['max_abs_logits']:.3g} ({p['split']})" for p in ro["pieces"])
        moved = sum(p["argmax_moved"] for p in ro["pieces"]) + ro["batched_vs_serial"]["argmax_moved"]
        lines.append(f"| {r['target']} | {ro['prompt_tokens']} tokens | {pieces} | "
                     f"{ro['batched_vs_serial']['max_abs_logits']:.3g} | {moved} of "
                     f"{ro['rows'] * (len(ro['pieces']) + 1)} rows | {ex['n_identical']} of "
                     f"{ex['n_sequences']} ({ex['n_sequences'] // ex['turns']} x {ex['turns']} turns) | "
                     f"{ex['n_near_tie_flips']} | {ex['n_failures']} |")
    partings = [(r["target"], p) for r in results for p in r["exact"]["partings"]]
    if partings:
        lines += ["", "Partings (sequence = conversation x turns + turn):", "",
                  "| target | sequence | token | margin | batched-vs-serial | diagnosis |",
                  "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {t} | {p['sequence']} | {p['first_difference'] + 1} | {p['margin']:.3g} | "
                  f"{p['batched_vs_serial']:.3g} | {p['diagnosis']} |" for t, p in partings]
    return "\n".join(lines + [""])
