"""T(n) out to n = 33 on the real GGUF targets, and what measuring it costs `--k auto` before its first token.

    flock /tmp/specmac-bench.lock python bench/wide_curve.py --models-dir /work/models \
        --out results/workloads_widek/wide_curve.json

For each Q4_K_M target (1.5B, 0.5B): the probe `--k auto` runs (specmac.core.calibration.pass_costs,
one sweep) over widths 1..17 (a model draft, K <= 16) and 1..33 (drafts that cost no pass, K <= 32),
each timed with its wall seconds, then the curve again with 3 sweeps (medians) as T(n)/T(1), and the
K that a free draft at acceptance 0.9 / 0.99 would choose on it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.backends import load_backend
from specmac.compare.results import _pyplot, provenance, save_figure, write_json
from specmac.core.calibration import pass_costs
from specmac.core.policy import AdaptiveK


def figure(rows: list[dict], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        n = range(1, len(row["ratio"]) + 1)
        ax.plot(n, row["ratio"], marker=".", label=row["model"])
    ax.plot([1, 33], [1, 33], ls=":", color="grey", label="serial (T(n) = n T(1))")
    ax.set_xlabel("tokens in one pass, n")
    ax.set_ylabel("T(n) / T(1)")
    ax.set_title("batched pass cost out to n = 33 (llama.cpp, 2-core CPU)")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=Path("results/workloads_widek/wide_curve.json"))
    ap.add_argument("--replot", action="store_true", help="only redraw the PNG from --out's JSON")
    args = ap.parse_args()
    if args.replot:
        import json

        figure(json.loads(args.out.read_text())["rows"], args.out.with_suffix(".png"))
        return
    command = "flock /tmp/specmac-bench.lock python bench/wide_curve.py " + shlex.join(sys.argv[1:])
    files = [args.models_dir / QWEN_15B_GGUF, args.models_dir / QWEN_05B_GGUF]
    rows = []
    for f in files:
        target = load_backend("gguf", str(f), None, role="target")
        row: dict = {"model": f.name}
        pass_costs(target, None, 4)  # pages the weights in
        for k_max in (16, 32):
            t0 = time.perf_counter()
            pass_costs(target, None, k_max)
            row[f"probe_s_k{k_max}"] = time.perf_counter() - t0
        curve, _ = pass_costs(target, None, 32, repeats=3)
        row["t_ms"] = [t * 1e3 for t in curve]
        row["ratio"] = [t / curve[0] for t in curve]
        for alpha in (0.9, 0.99):
            p = AdaptiveK(k_max=32)
            p.set_costs(curve, 0.0)
            p.acc, p.trials = 1000 * alpha, 1000.0
            row[f"best_k_at_{alpha}"] = p._best()
        rows.append(row)
        print(f.name, {k: v for k, v in row.items() if k not in ("t_ms", "ratio")},
              " ".join(f"{n + 1}:{r:.2f}" for n, r in enumerate(row["ratio"])), flush=True)
    write_json(args.out, {"provenance": provenance(command, files), "rows": rows})
    figure(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
