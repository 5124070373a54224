"""Level 3 of the proof on a real pair: `specmac verify`'s harness at paper scale.

    python bench/losslessness.py [--models-dir DIR] [--tokens 10000] [--out results/losslessness]
    python bench/losslessness.py --embedded --tokens 600 --out /tmp/lossless   # a smoke run
    python bench/losslessness.py samplers [--models-dir DIR] [--out results/samplers]
    python bench/losslessness.py turns [--models-dir DIR] --out results/turns/MACHINE
    python bench/losslessness.py partings results/workloads/MACHINE/results.json

``samplers``: what the coupled sampler costs beside the rejection rule on the same pair (acceptance,
tokens/s, the seed-exact check, the per-position cost of its noise): bench/lib/samplers.py.
``turns``: the round-off of a prompt processed in pieces (a conversation's reused cache) against one
piece, and `specmac verify --exact --turns` on full-precision targets: bench/lib/turns.py.
``partings``: a `specmac compare` record's greedy partings it called bugs, diagnosed again with this
checkout's diagnosis: bench/lib/partings.py.

Default pairings: Qwen2.5-Coder 0.5B -> 1.5B Q4_K_M (../shared/models/materialize.sh DIR qwen),
gguf -> gguf and gguf draft -> torch bf16 target (the 1.5B GGUF file dequantised to bf16 by the torch
backend's conversion cache; bf16 rather than fp32 because its plain decoding is twice as fast here).
Settings: T = 1, and T = 1 with top-k 40 and top-p 0.9. For each pairing x setting the harness of
``specmac.lossless.harness`` (fixed-length continuations, per-position / neighbour-pair / first-3 chi-squares
per context, Holm-adjusted; greedy diagnosis at T = 0) runs with --tokens per method. Each result
replaces the one of the same pairing and setting in OUT/results.json (the others stay, with their
own provenance and command) and OUT/README.md is rewritten from all of them, after every run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from lib.machine import take_machine
from lib.models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.api import Pair
from specmac.compare.results import provenance, write_json
from specmac.core.sampling import SamplingParams
from specmac.lossless.greedy import summary
from specmac.lossless.harness import two_sample_check

SETTINGS = {"T=1": SamplingParams(1.0), "T=1 top-k 40 top-p 0.9": SamplingParams(1.0, top_k=40, top_p=0.9)}


def pairings(args) -> dict[str, dict]:
    if args.embedded:  # the shipped tiny pair: no download, seconds
        return {"embedded gguf -> gguf": dict(target="gguf", draft="gguf")}
    d = Path(args.models_dir)
    draft = dict(draft="gguf", draft_model=str(d / QWEN_05B_GGUF))
    return {"gguf -> gguf": dict(target="gguf", target_model=str(d / QWEN_15B_GGUF), **draft),
            "gguf -> torch": dict(target="torch", target_model=str(d / QWEN_15B_GGUF),
                                  target_options={"dtype": "bfloat16"}, **draft)}


def main() -> int:
    if sys.argv[1:2] == ["samplers"]:
        from lib.samplers import main as samplers

        samplers(sys.argv[2:])
        return 0
    if sys.argv[1:2] == ["turns"]:
        from lib.turns import main as turns

        turns(sys.argv[2:])
        return 0
    if sys.argv[1:2] == ["partings"]:
        from lib.partings import main as partings

        partings(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--embedded", action="store_true", help="the embedded tiny pair instead of Qwen")
    ap.add_argument("--pairings", default=None, help="comma-separated subset of the pairing names")
    ap.add_argument("--tokens", type=int, default=10_000, help="tokens per method and setting")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/losslessness")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help="comma-separated subset of " + ", ".join(SETTINGS))
    args = ap.parse_args()
    pairs = pairings(args)
    if args.pairings:
        pairs = {k: v for k, v in pairs.items() if k in args.pairings.split(",")}
    out = Path(args.out)
    command = shlex.join(["python", *sys.argv])
    take_machine(command)  # not a timing, but an hour of both CPUs: it would skew another's
    results = previous(out / "results.json")
    for name, spec in pairs.items():
        pair = Pair.load(**spec)
        for label, params in SETTINGS.items():
            if label not in args.settings.split(","):
                continue
            t0 = time.perf_counter()
            res = two_sample_check(pair, params=params, n_tokens=args.tokens, k=args.k, seed=args.seed,
                                   greedy_tokens=args.greedy_tokens)
            models = [m for m in (spec.get("target_model"), spec.get("draft_model")) if m]
            res |= {"pairing": name, "setting": label, "seconds": time.perf_counter() - t0, **pair.info(),
                    "provenance": provenance(models=models) | {"command": command}}
            results = [r for r in results if (r["pairing"], r["setting"]) != (name, label)] + [res]
            write_json(out / "results.json", {"results": results})
            (out / "README.md").write_text(readme(results))
            print(f"{name} {label}: p = {res['p_value']:.3g}, {res['seconds']:.0f} s", file=sys.stderr)
    return 0


def previous(path: Path) -> list[dict]:
    """The results already in path (each with its own provenance)."""
    return json.loads(path.read_text())["results"] if path.exists() else []


def readme(results: list[dict]) -> str:
    lines = ["# Losslessness on a real pair (level 3)", "",
             "Speculative vs target-only continuations of fixed contexts, from "
             "`specmac.lossless.harness` (the "
             "harness of `specmac verify`); p is Holm-adjusted over the family of tests (each "
             "position, each two neighbouring positions, the first 3 tokens; chi2/dof are those of "
             "the decisive test). Min TV: the smallest shift in the distribution of the token at one "
             "position after one context caught with 80% power at the family's 5% level.", "",
             "| pairing | sampling | tokens/method | chi2 | dof | p | decisive test | min TV | accepted | "
             "corrected | bonus | target | greedy |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        kd = r["n_by_kind"]
        greedy = f"{r['greedy_agreement']:.0%}" + "".join(f"; {summary(m)}"
                                                          for m in r["greedy_mismatches"])
        lines.append(f"| {r['pairing']} | {r['setting']} | {r['n_tokens_per_method']} | {r['chi2']:.1f} | "
                     f"{r['dof']} | {r['p_value']:.3g} | {r['decisive_test']} | "
                     f"{r['min_detectable_tv']:.3f} | "
                     f"{kd['accepted']} | {kd['corrected']} | {kd['bonus']} | {kd['target']} | {greedy} |")
    commands = dict.fromkeys(r["provenance"]["command"] for r in results)
    return "\n".join(lines + ["", "Commands (each row's is in its provenance in results.json):", "",
                               *(f"    {c}" for c in commands), ""])


if __name__ == "__main__":
    sys.exit(main())
