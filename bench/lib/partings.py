"""The greedy partings of a `specmac compare` record, diagnosed again with this checkout's
diagnosis: a record keeps the verdicts of the commit that made it, and a better diagnosis should
not need the whole suite run again.

    python bench/losslessness.py partings results/workloads/MACHINE/results.json

The record's settings (pairings, backends with their models and options, prompts, chat template,
max_tokens per category) are loaded as compare loaded them, and compare's own step
(``specmac.compare.measure.diagnose_greedy``) diagnoses every (configuration, prompt) whose output
parted from plain decoding's. Writes rediagnosed.json beside the record (or ``--out``): per
configuration, the recorded partings and the new ones. Greedy records only.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from lib.machine import take_machine
from specmac.compare.measure import diagnose_greedy, load_models
from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts, select
from specmac.compare.results import provenance, write_json
from specmac.compare.settings import Settings, parse_pair
from specmac.core.sampling import SamplingParams


def settings_of(record: dict, prompts_path: str) -> Settings:
    """The Settings a compare record was measured with (its prompts read again from ``prompts_path``)."""
    st = record["settings"]
    by_id = {p["id"]: p for p in read_prompts(prompts_path, turns="all")}
    prompts = select([by_id[i] for i in st["prompts"]], max_tokens_for=st.get("max_tokens_for"))
    return Settings(pairs=[parse_pair(p) for p in st["pairs"]], ks=list(st["k"]), prompts=prompts,
                    params=SamplingParams(**st["sampling"]), max_tokens=st["max_tokens"],
                    repeats=st["repeats"], seed=st["seed"], backends=st["backends"], chat=st["chat"],
                    max_tokens_for=st.get("max_tokens_for") or {})


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/losslessness.py partings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record", type=Path, help="a specmac compare record's results.json")
    ap.add_argument("--prompts", default=PACKAGED_WORKLOAD, help="the prompts the record was run on")
    ap.add_argument("--out", type=Path, help="default: rediagnosed.json beside the record")
    args = ap.parse_args(argv)
    take_machine(shlex.join(["python", "bench/losslessness.py", "partings", *argv]))
    record = json.loads(args.record.read_text())
    settings = settings_of(record, args.prompts)
    if not settings.params.greedy:
        raise SystemExit(f"{args.record}: not a greedy record: no partings to diagnose")
    recorded = {r["config"]: r.get("greedy_mismatches") or [] for r in record["results"]}
    results = [{k: v for k, v in r.items() if k not in ("greedy_mismatches", "greedy_unexplained")}
               for r in record["results"]]
    diagnose_greedy(results, record["runs"], settings, load_models(settings))
    rows = [{"config": r["config"], "recorded": recorded[r["config"]], "rediagnosed": r["greedy_mismatches"],
             "unexplained": r["greedy_unexplained"]} for r in results if "greedy_mismatches" in r]
    for r in rows:
        print(f"{r['config']}: {len(r['rediagnosed'])} partings, {r['unexplained']} not near ties "
              f"(recorded: {sum(not m['near_tie'] for m in r['recorded'])})", flush=True)
    out = args.out or args.record.with_name("rediagnosed.json")
    write_json(out, {"provenance": provenance(), "record": str(args.record),
                     "record_commit": record["provenance"].get("git_sha"), "rows": rows})
    print(f"wrote {out}")
