"""Does advise's acceptance depend on the prompts it measures on? Teacher-forced tokens per target
pass (``specmac.advise.rank``) on advise's default prompts and on the anatomy's prompts, beside
what the anatomy's speculative runs measured on the Q4_K_M target.

    python bench/acceptance_prompts.py [--models-dir DIR] [--out results/anatomy]

It runs advise's whole measurement (``rank_configurations`` on the gguf variants) once per prompt
set and temperature, timing probes included, but reads only the acceptance, which timing does not
touch, so it may share the machine with other work. Writes OUT/acceptance_by_prompts.json (with
provenance) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.advise.rank import rank_configurations
from specmac.compare.prompts import advise_prompts, read_prompts
from specmac.compare.results import provenance, write_json
from specmac.core.sampling import SamplingParams

HERE = Path(__file__).resolve().parent


def measured_tokens_per_pass(record: dict, temp: float) -> dict[str, dict[int, float]]:
    """draft -> K -> tokens per target pass the anatomy measured on the Q4_K_M target."""
    out: dict[str, dict[int, float]] = {}
    for m in record["measured"]:
        if m["target"] == "gguf-q4" and m["temperature"] == temp:
            for r in m["results"]:
                if r["draft"] != "none" and r["k"] != "auto" and r["tokens_per_target_pass"]:
                    out.setdefault(r["draft"], {})[r["k"]] = r["tokens_per_target_pass"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "anatomy")
    ap.add_argument("--prompts", default=str(HERE / "data" / "anatomy_prompts.json"))
    ap.add_argument("--run-tokens", type=int, default=32, help="as the anatomy's runs")
    args = ap.parse_args()
    anatomy = json.loads((args.out / "results.json").read_text())
    sets = {"advise's default prompts": advise_prompts(),
            "the anatomy's prompts": [p["text"] for p in read_prompts(args.prompts)]}
    rows = []
    for temp in (0.0, 1.0):
        measured = measured_tokens_per_pass(anatomy, temp)
        for name, prompts in sets.items():
            r = rank_configurations([str(args.models_dir / QWEN_05B_GGUF)],
                                    [str(args.models_dir / QWEN_15B_GGUF)], params=SamplingParams(temp),
                                    prompts=prompts, backends=["gguf"], k_max=8, run_tokens=args.run_tokens)
            for a in r["acceptance"]:
                draft = "ngram" if a["draft"].startswith("ngram") else "gguf-q4"
                rows.append({"temperature": temp, "prompts": name, "draft": draft, "alpha": a["alpha"],
                             "predicted_tokens_per_pass": a["tokens_per_pass"],
                             "measured_tokens_per_pass": measured.get(draft, {})})
    models = [args.models_dir / QWEN_05B_GGUF, args.models_dir / QWEN_15B_GGUF]
    write_json(args.out / "acceptance_by_prompts.json",
               {"provenance": provenance(models=models), "rows": rows})
    print("| T | draft | prompts | α | tokens/pass K = 1, 2, 4, 8: teacher-forced | measured (anatomy) |")
    print("|---:|---|---|---:|---|---|")
    for x in rows:
        pred = ", ".join(f"{x['predicted_tokens_per_pass'][k - 1]:.2f}" for k in (1, 2, 4, 8))
        meas = ", ".join(f"{x['measured_tokens_per_pass'].get(k, float('nan')):.2f}" for k in (1, 2, 4, 8))
        print(f"| {x['temperature']:g} | {x['draft']} | {x['prompts']} | {x['alpha']:.2f} | {pred} "
              f"| {meas} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
