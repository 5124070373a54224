"""probe-parallelism on every backend and precision, on the embedded target and Qwen2.5-Coder 1.5B.

Each configuration runs the real command (`python -m specmac probe-parallelism ... --out`), timed
from start to exit, and writes results/probes/<label>.json (record + provenance + wall_s). Then
the plots and results/probes/README.md are rebuilt from every JSON in the folder, so a partial
rerun (--only) keeps the other rows.

    python bench/probe_parallelism.py [--only LABEL ...] [--quick] [--models-dir DIR]

Models: the embedded pair (specmac/assets) and, from --models-dir (bench/models.py: $SPECMAC_MODELS,
default ~/.cache/specmac/models, made by ../shared/models/materialize.sh), the official
Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF file qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (SHA-256 in each
record) and, for torch and mlx, an HF folder converted from it with transformers' GGUF loader
(qwen2.5-coder-1.5b-instruct-hf). Configurations whose model or backend is missing are skipped
with the reason printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from models import QWEN_15B_GGUF, QWEN_15B_HF, add_models_dir

from specmac import assets
from specmac.backends import missing_requirements
from specmac.compare.results import plot_parallelism, sha256_file, write_json

OUT = Path(__file__).resolve().parent.parent / "results" / "probes"
# quantized with llama.cpp's own quantizer (llama_model_quantize) when missing; timing is what the
# probe measures, so a requantized Qwen (from the official Q4_K_M) is as good as an upstream one
QUANTS = {"f16": 1, "q8_0": 7, "q4_0": 2}  # LLAMA_FTYPE_MOSTLY_*
# one thread: on this 2-core machine, shared with a training job, two spinning llama.cpp / torch
# threads were preempted so often that a 1.5B token took 2-100x longer and timings were noise
THREADS = 1
# the embedded model's passes take ~0.1 ms, where one preemption is 100x that: more repeats
EMBEDDED_FLAGS = ["--repeats", "9"]


def quantize(src: Path, models: Path, quant: str) -> Path:
    """src quantized to ``quant`` by llama.cpp, kept in the models folder under a name that holds
    the source's SHA-256 prefix (so a retrained embedded model is never probed through a stale copy)."""
    dst = models / f"{src.stem}-{sha256_file(src)[:12]}-{quant}.gguf"
    if dst.exists():
        return dst
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = QUANTS[quant], True, 2
    tmp = dst.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src} -> {quant}")
    tmp.rename(dst)
    return dst


def gguf_variants(models: Path) -> list[dict]:
    """The embedded target as shipped (f16, q8_0) and as q4_0; Qwen 1.5B as shipped and requantized."""
    out = []
    for q in QUANTS:
        if q in assets.GGUF_TYPES:
            out.append({"label": f"embedded-gguf-{q}", "model": None, "opts": {"quant": q},
                        "needs": assets.gguf_file("target", q), "group": "embedded",
                        "flags": EMBEDDED_FLAGS})
        else:
            out.append({"label": f"embedded-gguf-{q}", "model": None, "opts": {},
                        "needs": assets.gguf_file("target", "f16"), "group": "embedded",
                        "make": (assets.gguf_file("target", "f16"), q), "flags": EMBEDDED_FLAGS})
    out.append({"label": "qwen1.5b-gguf-q4_k_m", "model": models / QWEN_15B_GGUF, "opts": {},
                "needs": models / QWEN_15B_GGUF, "group": "qwen1.5b"})
    # the same with every default (the "finishes in under a minute" check), threads included
    out.append({"label": "qwen1.5b-gguf-q4_k_m-all-defaults", "model": models / QWEN_15B_GGUF, "opts": {},
                "needs": models / QWEN_15B_GGUF, "group": "defaults", "threads": False})
    for q in ("q8_0", "q4_0"):
        out.append({"label": f"qwen1.5b-gguf-{q}-requant", "model": None,
                    "opts": {}, "needs": models / QWEN_15B_GGUF, "group": "qwen1.5b",
                    "make": (models / QWEN_15B_GGUF, q)})
    for c in out:
        c["backend"] = "gguf"
        if c.pop("threads", True):
            c["opts"]["n_threads"] = THREADS
    return out


def configs(models: Path) -> list[dict]:
    """label, backend, model (None = embedded), options, extra CLI flags, group (plot panel set)."""
    emb = [

        {"label": "embedded-torch-fp32", "backend": "torch", "model": None,
         "opts": {"dtype": "float32", "device": "cpu", "n_threads": THREADS},
         "needs": assets.hf_dir("target") / "config.json"},
        {"label": "embedded-mlx-fp32", "backend": "mlx", "model": None, "opts": {"dtype": "float32"},
         "needs": assets.hf_dir("target") / "config.json"},
        {"label": "embedded-gguf-q8_0-serial-control", "backend": "gguf", "model": None,
         "opts": {"quant": "q8_0", "n_threads": THREADS}, "flags": ["--serial"],
         "needs": assets.gguf_file("target", "q8_0")},
    ]
    for c in emb:
        c["group"] = "embedded"
        c.setdefault("flags", [])
        c["flags"] = [*c["flags"], *EMBEDDED_FLAGS]
    qwen = [
        {"label": "qwen1.5b-torch-fp32", "backend": "torch", "model": models / QWEN_15B_HF,
         "opts": {"dtype": "float32", "device": "cpu", "n_threads": THREADS},
         "flags": ["--n-max", "8", "--repeats", "2"]},
        {"label": "qwen1.5b-mlx-fp32", "backend": "mlx", "model": models / QWEN_15B_HF,
         "opts": {"dtype": "float32"}, "flags": ["--n-max", "8", "--repeats", "2"]},
    ]
    for c in qwen:
        c["group"], c["needs"] = "qwen1.5b", c["model"]
    return gguf_variants(models) + emb + qwen


def skip_reason(c: dict) -> str | None:
    missing = missing_requirements(c["backend"])
    if missing:
        return f"{c['backend']} backend not installed ({', '.join(missing)})"
    if not Path(c["needs"]).exists():
        return f"model not found: {c['needs']}"
    return None


def run_one(c: dict, quick: bool, models: Path) -> dict:
    if "make" in c:
        src, quant = c["make"]
        c["model"] = quantize(src, models, quant)
    out = OUT / f"{c['label']}.json"
    cmd = [sys.executable, "-m", "specmac", "probe-parallelism", "--backend", c["backend"],
           "--out", str(out)]
    if c["model"] is not None:
        cmd += ["--model", str(c["model"])]
    for k, v in c["opts"].items():
        cmd += ["--opt", f"{k}={v}"]
    cmd += c.get("flags", [])
    if quick:
        cmd += ["--n-max", "8", "--repeats", "2", "--context", "64"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    record = json.loads(out.read_text())
    record.update(label=c["label"], group=c["group"], wall_s=time.perf_counter() - t0)
    write_json(out, record)
    return record


def rebuild_outputs() -> None:
    records = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]
    for group in sorted({r["group"] for r in records}):
        rs = [{**r, "label": f"{r['label']}: \u03b2 = {r['beta']:.2f}, {r['verdict']}"}
              for r in records if r["group"] == group]
        plot_parallelism(rs, OUT / f"parallelism-{group}.png",
                         title=f"T(n): one batched score of n tokens vs n one-token scores ({group})")
    write_readme(records)


def write_readme(records: list[dict]) -> None:
    head = (OUT / "README.head.md").read_text() if (OUT / "README.head.md").exists() else ""
    rows = ["| configuration | T(1) ms | batched T(n_max) ms | serial T(n_max) ms | \u03b2 (fit) "
            "| verdict | \u03b2 of serial curve | max \\|\u0394logit\\| | argmax flips / rows | "
            "command wall s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        rows.append(
            f"| {r['label']} | {r['batched_ms'][0]:.2f} \u00b1 {r['batched_iqr_ms'][0]:.2f} "
            f"| {r['batched_ms'][-1]:.2f} \u00b1 {r['batched_iqr_ms'][-1]:.2f} (n={r['n'][-1]}) "
            f"| {r['serial_ms'][-1]:.2f} \u00b1 {r['serial_iqr_ms'][-1]:.2f} | {r['beta']:.2f} "
            f"| {r['verdict']} | {r['beta_serial']:.2f} | {r['max_abs_logit_diff']:.3g} "
            f"| {r['argmax_flips']} / {r['rows_compared']} | {r.get('wall_s', float('nan')):.0f} |")
    body = "\n".join(rows)
    (OUT / "README.md").write_text(f"{head}\n## Results (regenerated by bench/probe_parallelism.py)\n\n"
                                   f"Medians over repeats, \u00b1 the interquartile range.\n\n{body}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="labels to (re)run; default all")
    ap.add_argument("--quick", action="store_true", help="n_max 8, 2 repeats, context 64")
    add_models_dir(ap)
    ap.add_argument("--list", action="store_true", help="print the labels and exit")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for c in configs(args.models_dir):
        if args.list:
            print(c["label"])
            continue
        if args.only and c["label"] not in args.only:
            continue
        why = skip_reason(c)
        if why:
            print(f"skip {c['label']}: {why}", flush=True)
            continue
        r = run_one(c, args.quick, args.models_dir)
        print(f"{c['label']}: beta {r['beta']:.2f} ({r['verdict']}), T1 {r['t1_ms']:.2f} ms, "
              f"flips {r['argmax_flips']}/{r['rows_compared']}, {r['wall_s']:.0f} s", flush=True)
    if not args.list:
        rebuild_outputs()


if __name__ == "__main__":
    main()
