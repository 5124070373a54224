"""Level 3 of the proof on a real pair: `specmac verify`'s harness at paper scale.

    python bench/losslessness.py [--models-dir DIR] [--tokens 10000] [--out results/losslessness]
    python bench/losslessness.py --embedded --tokens 600 --out /tmp/lossless   # a smoke run

Default pairings: Qwen2.5-Coder 0.5B -> 1.5B Q4_K_M (../shared/models/materialize.sh DIR qwen),
gguf -> gguf and gguf draft -> torch target (the 1.5B HF folder of bench/convert_gguf_to_hf.py).
Settings: T = 1, and T = 1 with top-k 40 and top-p 0.9. For each pairing x setting the harness of
``specmac.proof`` (fixed-length continuations, per-position / neighbour-pair / first-3 chi-squares
per context, Holm-adjusted; greedy diagnosis at T = 0) runs with --tokens per method. Writes
OUT/results.json (every result with provenance) and OUT/README.md (the table and the command).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_15B_GGUF, QWEN_15B_HF, add_models_dir

from specmac.api import Pair
from specmac.proof import two_sample_check
from specmac.proof_greedy import summary
from specmac.results import provenance, write_json
from specmac.sampling import SamplingParams

SETTINGS = {"T=1": SamplingParams(1.0), "T=1 top-k 40 top-p 0.9": SamplingParams(1.0, top_k=40, top_p=0.9)}


def pairings(args) -> dict[str, dict]:
    if args.embedded:  # the shipped tiny pair: no download, seconds
        return {"embedded gguf -> gguf": dict(target="gguf", draft="gguf")}
    d = Path(args.models_dir)
    draft = dict(draft="gguf", draft_model=str(d / QWEN_05B_GGUF))
    return {"gguf -> gguf": dict(target="gguf", target_model=str(d / QWEN_15B_GGUF), **draft),
            "gguf -> torch": dict(target="torch", target_model=str(d / QWEN_15B_HF), **draft)}


def main() -> int:
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
    results = []
    for name, spec in pairs.items():
        pair = Pair.load(**spec)
        for label, params in SETTINGS.items():
            if label not in args.settings.split(","):
                continue
            t0 = time.perf_counter()
            res = two_sample_check(pair, params=params, n_tokens=args.tokens, k=args.k, seed=args.seed,
                                   greedy_tokens=args.greedy_tokens)
            res |= {"pairing": name, "setting": label, "seconds": time.perf_counter() - t0, **pair.info()}
            results.append(res)
            print(f"{name} {label}: p = {res['p_value']:.3g}, {res['seconds']:.0f} s", file=sys.stderr)
    out = Path(args.out)
    models = [s.get(m) for s in pairs.values() for m in ("target_model", "draft_model") if s.get(m)]
    write_json(out / "results.json", {"provenance": provenance(models=models), "results": results})
    (out / "README.md").write_text(readme(results, " ".join(["python", *sys.argv])))
    return 0


def readme(results: list[dict], command: str) -> str:
    lines = ["# Losslessness on a real pair (level 3)", "",
             "Speculative vs target-only continuations of fixed contexts, from `specmac.proof` (the "
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
    return "\n".join(lines + ["", f"Command: `{command}`", ""])


if __name__ == "__main__":
    sys.exit(main())
