"""T(n) out to n = 33 on every target of the same 1.5B weights: how wide a draft can go and pay.

    for t in "gguf qwen2.5-coder-1.5b-instruct-q4_k_m.gguf q4_k_m" \\
             "gguf qwen2.5-coder-1.5b-instruct-f16.gguf f16" \\
             "torch qwen2.5-coder-1.5b-instruct-hf-bf16 bf16"; do set -- $t
      SPECMAC_CACHE=$(mktemp -d) flock /tmp/specmac-bench.lock specmac probe-parallelism --backend $1 \\
        --model $MODELS/$2 $([ $1 = torch ] && echo --opt dtype=bfloat16) --n-max 33 --repeats 3 \\
        --out results/probes_wide/qwen1.5b-$1-$3-n33.json --plot results/probes_wide/qwen1.5b-$1-$3-n33.png
    done
    python bench/wide_curves.py

reads the probes' JSON records in results/probes_wide and writes README.md (T(n)/T(1) at chosen
widths; for a draft every token of which is kept, the width with the most tokens per second, n/T(n);
for drafts kept at rate alpha, the same with E(n) = sum alpha^j) and wide_curves.png.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specmac.compare.results import pyplot, save_figure

OUT = Path("results/probes_wide")
SHOW = [2, 4, 8, 9, 16, 17, 24, 32, 33]
ALPHAS = [1.0, 0.95, 0.8]


def best_width(n: np.ndarray, t: np.ndarray, alpha: float) -> tuple[int, float]:
    """The width n (a target pass over n - 1 drafts and one more) with the most tokens per T(1)."""
    e = np.array([np.sum(alpha ** np.arange(k)) for k in n])  # E = 1 + alpha + ... + alpha^(n-1)
    rate = e / (t / t[0])
    i = int(np.argmax(rate))
    return int(n[i]), float(rate[i])


def main() -> None:
    records = [(p.stem, json.loads(p.read_text())) for p in sorted(OUT.glob("*.json"))]
    head = ["target", "T(1) ms", *(f"T({k})/T(1)" for k in SHOW),
            *(f"best width, \u03b1 = {a} (tokens per T(1))" for a in ALPHAS)]
    lines = ["# T(n) out to n = 33 on the three targets of the same Qwen2.5-Coder 1.5B weights", "",
             "```bash", "\n".join(x[4:] for x in __doc__.split("\n\n")[1].splitlines()), "```",
             "", "One batched score of n tokens after a 256-token context, median of 3 repeats "
             "(`specmac probe-parallelism`). 'best width': the n with the most tokens per second for a "
             "draft kept at rate \u03b1 (E(n) = 1 + \u03b1 + \u2026 + \u03b1^(n-1) tokens for a pass "
             "of T(n)), in units of plain decoding's T(1).", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for name, r in records:
        n, t = np.asarray(r["n"]), np.asarray(r["batched_ms"], float)
        ratio = t / t[0]
        at = {int(k): v for k, v in zip(n, ratio)}
        cells = [name, f"{t[0]:.1f}", *(f"{at[k]:.2f}" if k in at else "\u2013" for k in SHOW)]
        cells += [f"n = {w} ({rate:.2f})" for w, rate in (best_width(n, t, a) for a in ALPHAS)]
        lines.append("| " + " | ".join(cells) + " |")
        ax.plot(n, ratio, marker=".", label=f"{name} (T(1) {t[0]:.0f} ms)")
    ax.plot([1, 33], [1, 33], "k:", lw=1, label="serial: T(n) = n T(1)")
    ax.set_ylim(0, 20)
    ax.set_xlabel("tokens scored in one batched pass (n)")
    ax.set_ylabel("T(n) / T(1)")
    ax.set_title("Batched pass cost out to n = 33 (Qwen2.5-Coder 1.5B, 2 CPU cores)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, OUT / "wide_curves.png")
    lines += ["", "![T(n)](wide_curves.png)", ""]
    (OUT / "README.md").write_text("\n".join(lines) + "\n", "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
