"""Predicted Outputs at K auto against K = 32 through `specmac serve`: the code edit of bench/serve.py alone.

Target only, the file as ``prediction`` at K auto (which may now go to K = 32 where drafts cost no
pass) and at K = 32, interleaved per round (round 0: a short discarded warm-up of each, which also
measures the pass costs), greedy, every text compared with the target-only text.

    SPECMAC_CACHE=$(mktemp -d) flock /tmp/specmac-bench.lock python bench/prediction_k.py \
        --models-dir /work/models --out results/prediction_k
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from serve import DRAFT, TARGET, SpecmacServer, edit, figure

from specmac.api import Pair
from specmac.compare.results import code_measured, provenance, write_json


def main() -> None:
    code_measured()  # the commit as the run starts: what its provenance records
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=os.environ.get("SPECMAC_MODELS", "/work/models"))
    ap.add_argument("--out", default="results/prediction_k")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--edit-max-tokens", type=int, default=480)
    args = ap.parse_args()
    target = Path(args.models_dir) / TARGET
    out = Path(args.out)
    command = ("SPECMAC_CACHE=$(mktemp -d) flock /tmp/specmac-bench.lock python bench/prediction_k.py "
               + shlex.join(sys.argv[1:]))
    pair = Pair.load("gguf", None, target_model=str(target))
    srv = SpecmacServer(pair, k="auto")
    try:
        peers = {"specmac, target only": (srv, {"speculative": {"k": 0}}),
                 "specmac, prediction (K auto)": (srv, {}),
                 "specmac, prediction (K=32)": (srv, {"speculative": {"k": 32}})}
        record = {"provenance": provenance(command, [target]), "settings": vars(args),
                  "edit": edit(peers, args.rounds, args.edit_max_tokens)}
    finally:
        srv.close()
    write_json(out / "results.json", record)
    figure(record, out / "prediction_k.png")
    rows = record["edit"]["rows"]
    base = rows["specmac, target only"]["tokens_per_second"]
    lines = [f"# Predicted Outputs, K auto vs K = 32 ({TARGET}, the draft model {DRAFT} not used)", "",
             f"`{command}`", "",
             f"The code edit of bench/serve.py ({record['edit']['change']} in {record['edit']['file']}, "
             f"{record['edit']['file_lines']} lines; the file as `prediction`), {args.rounds} rounds after a "
             f"warm-up, greedy, through the server, streaming; renamed: {record['edit']['renamed']}.", "",
             "| configuration | tokens/s (median [min, max]) | vs target only | tokens | target passes | "
             "accepted / rejected prediction tokens | text = target only |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, r in rows.items():
        spec = r.get("speculative") or {}
        det = r.get("completion_tokens_details") or {}
        lines.append(f"| {name} | {r['tokens_per_second']:.1f} [{r['min']:.1f}, {r['max']:.1f}] | "
                     f"{r['tokens_per_second'] / base:.2f}x | {r['tokens']:.0f} | "
                     f"{spec.get('target_passes', '-')} | {det.get('accepted_prediction_tokens', '-')} / "
                     f"{det.get('rejected_prediction_tokens', '-')} | {r['text_equals_target_only']} |")
    lines += ["", "![tokens/s](prediction_k.png)", ""]
    (out / "README.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
