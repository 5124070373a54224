"""What `--k auto` pays before its first token: the probe of the pair's pass costs, measured and kept.

    python bench/calibration_cost.py --out results/anatomy_auto/calibration_cost.json

For each target of bench/anatomy.py with the Q4_K_M 0.5B draft: the seconds the probe of
specmac.core.calibration takes (every width 1..17 and the draft's pass: what a pair's first `--k auto`
run pays), the same costs read back from the cache of kept costs (what later runs pay; a cache in
a temporary folder, not the user's) and checked against a one-token pass timed now (``fresh_t1``),
once on an empty target (a process's first run: a short prefill, then the pass) and once on a
target holding a 400-token context (every later run, after the run before it: the pass alone),
and T(1), with 64 x T(1) beside it (the passes of 64 tokens of plain decoding, not a timed run).
The anatomy's auto runs start every run from costs measured once per target, as `--k auto` does
from a pair's second run on.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from anatomy import DRAFTS, TARGETS
from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.backends import load_backend
from specmac.compare.results import provenance, write_json
from specmac.core.calibration import cached_pass_costs
from specmac.core.timing import probe_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=Path("results/anatomy_auto/calibration_cost.json"))
    args = ap.parse_args()
    backend, model, opts = DRAFTS["gguf-q4"]
    draft = load_backend(backend, str(args.models_dir / model), opts, role="draft")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (backend, model, opts, group) in TARGETS.items():
            target = load_backend(backend, str(args.models_dir / model), opts, role="target")
            os.environ["SPECMAC_CACHE"] = str(Path(tmp) / name)  # kept costs go there (models loaded)
            t0 = time.perf_counter()
            t_target, _, cached = cached_pass_costs(target, draft, 16)
            probe = time.perf_counter() - t0
            assert not cached
            t0 = time.perf_counter()
            again = cached_pass_costs(target, draft, 16)
            read = time.perf_counter() - t0
            assert again[2] and again[0] == t_target
            target.prefill(probe_tokens(target, 400))  # what a run leaves: its context
            t0 = time.perf_counter()
            after = cached_pass_costs(target, draft, 16)
            read_after = time.perf_counter() - t0
            assert after[2] and after[0] == t_target and target.n_past == 400
            os.environ.pop("SPECMAC_CACHE")
            rows.append({"target": name, "group": group, "probe_s": probe, "kept_s": read,
                         "kept_after_run_s": read_after,
                         "t1_ms": 1e3 * t_target[0], "64_t1_s": 64 * t_target[0]})
            print(f"{name}: probe {probe:.1f} s, kept {1e3 * read:.0f} ms, "
                  f"after a run {1e3 * read_after:.0f} ms, T(1) {1e3 * t_target[0]:.0f} ms", file=sys.stderr)
            target = None
    command = "python bench/calibration_cost.py " + " ".join(sys.argv[1:])
    write_json(args.out, {"rows": rows, "draft": "gguf Q4_K_M 0.5B",
                          "provenance": provenance(command, [args.models_dir / QWEN_05B_GGUF,
                                                             args.models_dir / QWEN_15B_GGUF])})
    print("| target | probe before a pair's first run | kept costs, checked on an empty target | "
          "kept costs, checked after a run | T(1) | 64 x T(1) |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['target']} | {r['probe_s']:.1f} s | {1e3 * r['kept_s']:.0f} ms | "
              f"{1e3 * r['kept_after_run_s']:.0f} ms | {r['t1_ms']:.0f} ms | {r['64_t1_s']:.1f} s |")


if __name__ == "__main__":
    main()
