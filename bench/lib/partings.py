"""The greedy partings a `specmac compare` record could not explain, diagnosed again with this
checkout's diagnosis (``specmac.lossless.greedy.diagnose``): a record keeps the verdicts of the
commit that made it, and a better diagnosis should not need the whole suite run again.

    python bench/losslessness.py partings results/workloads/MACHINE/results.json

For each (configuration, prompt) the record lists as "NOT near-tie", the same pair (the record's
backends and model files), the same prompt (through the chat template where the record used one),
K and max_tokens, from empty caches; writes rediagnosed.json beside the record (or ``--out``):
the recorded verdict and the new one, side by side. Greedy records only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from lib.machine import take_machine
from specmac.api import Pair
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
from specmac.compare.results import provenance, write_json
from specmac.lossless.greedy import diagnose


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/losslessness.py partings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path, help="a specmac compare record's results.json")
    ap.add_argument("--prompts", default=PACKAGED_WORKLOAD, help="the prompts the record was run on")
    ap.add_argument("--out", type=Path, help="default: rediagnosed.json beside the record")
    args = ap.parse_args(argv)
    take_machine(shlex.join(["python", "bench/losslessness.py", "partings", *argv]))
    record = json.loads(args.record.read_text())
    settings, backends = record["settings"], record["settings"]["backends"]
    prompts = {p["id"]: p for p in read_prompts(args.prompts, turns="all")}
    pairs: dict[str, Pair] = {}
    rows = []
    for row in record["results"]:
        for m in row.get("greedy_mismatches") or []:
            if m["near_tie"]:
                continue
            draft, target, k = row["draft"], row["target"], row["k"]
            if row["config"] not in pairs:
                model = draft.split("+")[-1]  # the model source of a hybrid, or the draft itself
                pairs[row["config"]] = Pair.load(
                    target, draft, target_model=backends.get(target, {}).get("target_model"),
                    draft_model=backends.get(model, {}).get("draft_model") if model in backends else None)
            pair, p = pairs[row["config"]], prompts[m["prompt"]]
            text = (pair.target.apply_chat_template(p.get("messages") or p["text"]) if settings["chat"]
                    else p["text"])
            t0 = time.perf_counter()
            new = diagnose(pair, pair.encode(text), k=k if k == "auto" else int(k),
                           max_tokens=(settings.get("max_tokens_for") or {}).get(p.get("category"),
                                                                                 settings["max_tokens"]))
            rows.append({"config": row["config"], "prompt": m["prompt"],
                         "recorded": {x: m[x] for x in ("first_difference", "top2_gap", "batched_vs_serial",
                                                         "near_tie")},
                         "rediagnosed": new, "seconds": round(time.perf_counter() - t0, 1)})
            verdict = new.get("near_tie", "no parting")
            print(f"{row['config']} {m['prompt']}: near tie {m['near_tie']} -> {verdict}", flush=True)
    out = args.out or args.record.with_name("rediagnosed.json")
    write_json(out, {"provenance": provenance(), "record": str(args.record),
                     "record_commit": record["provenance"].get("git_sha"), "rows": rows})
    print(f"wrote {out}")
