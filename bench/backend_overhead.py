"""Each backend's per-token cost against its own library's generate loop, on the same model.

    python bench/backend_overhead.py --out results/backend_overhead

Runs bench/backend_overhead_{gguf,torch,mlx}.py one after another (greedy, 64 tokens, median of
repeats, one thread each so that the comparison is not decided by thread contention on a shared
machine) on the embedded target, and writes results.json (with provenance), README.md and a PNG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from specmac.results import provenance, write_json

HERE = Path(__file__).parent
RUNS = {  # backend -> (script args, backend ms/token key, library ms/token key, library loop)
    "gguf": (["--threads", "1"], "backend_ms_per_token", "llama_generate_ms_per_token", "Llama.generate"),
    "torch": (["--threads", "1"], "backend_ms_per_token", "generate_ms_per_token", "model.generate"),
    "mlx": ([], "ms_per_token_specmac", "ms_per_token_mlx_lm", "mlx_lm generate_step"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("results/backend_overhead"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for name, (extra, ours, theirs, loop) in RUNS.items():
        script = HERE / f"backend_overhead_{name}.py"
        cmd = [sys.executable, str(script), "--repeats", str(args.repeats), *extra]
        raw = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        rows.append({"backend": name, "library_loop": loop, "specmac_ms_per_token": raw[ours],
                     "library_ms_per_token": raw[theirs], "ratio": raw[ours] / raw[theirs], "raw": raw})
        print(name, rows[-1]["ratio"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "results.json", {"provenance": provenance(" ".join(sys.argv)), "rows": rows})
    table = ["| backend | library loop | specmac ms/token | library ms/token | ratio |",
             "|---|---|---|---|---|"]
    table += [f"| {r['backend']} | {r['library_loop']} | {r['specmac_ms_per_token']:.3f} | "
              f"{r['library_ms_per_token']:.3f} | {r['ratio']:.2f} |" for r in rows]
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["specmac_ms_per_token"] for r in rows], 0.4, label="specmac backend")
    ax.bar([i + 0.2 for i in x], [r["library_ms_per_token"] for r in rows], 0.4, label="library's own loop")
    ax.set_xticks(list(x), [f"{r['backend']}\n({r['library_loop']})" for r in rows])
    ax.set_ylabel("ms per generated token (median)")
    ax.set_title("Greedy decoding of the embedded target, 1 thread, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "overhead.png", dpi=120)
    print("\n".join(table))


if __name__ == "__main__":
    main()
