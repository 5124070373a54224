"""Does advise's acceptance depend on the prompts it measures on? Teacher-forced tokens per target
pass (``specmac.advise.rank``) on advise's default prompts and on the anatomy's prompts, beside
what the anatomy's speculative runs measured on the Q4_K_M target.

    python bench/anatomy.py --acceptance-by-prompts [--models-dir DIR] [--out results/anatomy]

It runs advise's whole measurement (``rank_configurations`` on the gguf variants) once per prompt
set and temperature, timing probes included, but reads only the acceptance, which timing does not
touch, so it may share the machine with other work. Writes OUT/acceptance_by_prompts.json (with
provenance) and prints a table.
"""

from __future__ import annotations

import json
from pathlib import Path

from lib.models import QWEN_05B_GGUF, QWEN_15B_GGUF
from specmac.advise.rank import rank_configurations
from specmac.compare.prompts import advise_prompts, read_prompts
from specmac.compare.results import provenance, write_json
from specmac.core.sampling import SamplingParams


def measured_tokens_per_pass(record: dict, temp: float) -> dict[str, dict[int, float]]:
    """draft -> K -> tokens per target pass the anatomy measured on the Q4_K_M target."""
    out: dict[str, dict[int, float]] = {}
    for m in record["measured"]:
        if m["target"] == "gguf-q4" and m["temperature"] == temp:
            for r in m["results"]:
                if r["draft"] != "none" and r["k"] != "auto" and r["tokens_per_target_pass"]:
                    out.setdefault(r["draft"], {})[r["k"]] = r["tokens_per_target_pass"]
    return out


def acceptance_by_prompts(models_dir: Path, out: Path, prompts_file: str, run_tokens: int = 32) -> None:
    """Write OUT/acceptance_by_prompts.json and print its table (``run_tokens``: as the anatomy's runs)."""
    anatomy = json.loads((out / "results.json").read_text())
    sets = {"advise's default prompts": advise_prompts(),
            "the anatomy's prompts": [p["text"] for p in read_prompts(prompts_file)]}
    rows = []
    for temp in (0.0, 1.0):
        measured = measured_tokens_per_pass(anatomy, temp)
        for name, prompts in sets.items():
            r = rank_configurations([str(models_dir / QWEN_05B_GGUF)],
                                    [str(models_dir / QWEN_15B_GGUF)], params=SamplingParams(temp),
                                    prompts=prompts, backends=["gguf"], k_max=8, run_tokens=run_tokens)
            for a in r["acceptance"]:
                draft = "ngram" if a["draft"].startswith("ngram") else "gguf-q4"
                rows.append({"temperature": temp, "prompts": name, "draft": draft, "alpha": a["alpha"],
                             "predicted_tokens_per_pass": a["tokens_per_pass"],
                             "measured_tokens_per_pass": measured.get(draft, {})})
    models = [models_dir / QWEN_05B_GGUF, models_dir / QWEN_15B_GGUF]
    write_json(out / "acceptance_by_prompts.json", {"provenance": provenance(models=models), "rows": rows})
    print("| T | draft | prompts | α | tokens/pass K = 1, 2, 4, 8: teacher-forced | measured (anatomy) |")
    print("|---:|---|---|---:|---|---|")
    for x in rows:
        pred = ", ".join(f"{x['predicted_tokens_per_pass'][k - 1]:.2f}" for k in (1, 2, 4, 8))
        meas = ", ".join(f"{x['measured_tokens_per_pass'].get(k, float('nan')):.2f}" for k in (1, 2, 4, 8))
        print(f"| {x['temperature']:g} | {x['draft']} | {x['prompts']} | {x['alpha']:.2f} | {pred} "
              f"| {meas} |")
