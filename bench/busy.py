"""Decoding on a busy machine: plain, K = 4 and --k auto, quiet and beside 1 and 2 busy processes.

    python bench/busy.py [--models-dir DIR] [--out results/busy]

Qwen2.5-Coder 1.5B Q4_K_M target, 0.5B Q4_K_M draft (gguf both), one chat prompt, 64 new tokens,
greedy. Each condition (load x thread setting) runs in its own process, because libgomp reads its
settings once: the busy processes (``while True: pass`` in Python) start first, then the child
loads the pair, discards a warm-up run of each method and measures ``--rounds`` rounds in which
plain, K = 4 and auto alternate. Auto's pass costs are measured in the condition itself (a fresh
cache per child), as a user's first run there would. Thread settings: the old default (the
backends' default thread count whatever the load: SPECMAC_THREADS=fixed), the new default (threads
fitted before each run to the CPUs other work leaves free: specmac/backends/threads.py), each with
OMP_WAIT_POLICY=PASSIVE (libgomp's idle threads sleep at once instead of spinning), and one thread
per model. ``--target torch:FOLDER`` runs a torch bf16 target instead (the same 0.5B GGUF draft).
Writes busy.json
(runs, medians, provenance), README.md (the table) and busy.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib.machine import take_machine
from lib.models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a short docstring."
METHODS = {"plain": None, "K=4": 4, "auto": "auto"}
SETTINGS = {  # name -> (environment, n_threads or None for the default)
    "fixed threads (old default)": ({"SPECMAC_THREADS": "fixed"}, None),
    "fitted threads (new default)": ({}, None),
    "fitted passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, None),
    "fixed passive": ({"SPECMAC_THREADS": "fixed", "OMP_WAIT_POLICY": "PASSIVE"}, None),
    "1 thread": ({}, 1),
    "passive 1 thread": ({"OMP_WAIT_POLICY": "PASSIVE"}, 1),
    "spincount 10k": ({"GOMP_SPINCOUNT": "10000", "SPECMAC_THREADS": "fixed"}, None),  # see README
}
BUSY = "while True: pass"


def child(args) -> None:
    """One condition: load, warm up, rounds of plain / K=4 / auto; print the runs as JSON."""
    from specmac.api import Pair
    from specmac.backends import load_backend
    from specmac.core.drafters import ModelDrafter

    opts = {"n_threads": args.threads} if args.threads else {}
    if args.target == "gguf":
        target = load_backend("gguf", str(args.models_dir / QWEN_15B_GGUF), opts, role="target")
    else:  # torch:FOLDER, bf16
        target = load_backend("torch", args.target.split(":", 1)[1], opts | {"dtype": "bfloat16"},
                              role="target")
    draft = load_backend("gguf", str(args.models_dir / QWEN_05B_GGUF), opts, role="draft")
    pair = Pair(target, ModelDrafter(draft))
    ids = pair.encode(target.apply_chat_template(PROMPT))
    runs = []
    for rnd in range(-1, args.rounds):  # round -1: the warm-up, discarded
        for name, k in METHODS.items():
            p = pair.plain() if k is None else pair
            g = p.generate(ids, k=k or 1, max_tokens=8 if rnd < 0 else args.tokens, seed=0)
            if rnd >= 0:
                runs.append({"method": name, "round": rnd, "tokens": g.stats.n_tokens,
                             "seconds": g.stats.seconds, "tokens_per_second": g.stats.tokens_per_second})
    fitter = getattr(target, "_threads", None)
    print(json.dumps({"runs": runs, "threads": target.resolved["n_threads"], "fitted": pair.threads_now(),
                      "refits": getattr(fitter, "changes", None)}))


def condition(args, n_busy: int, setting: str) -> dict:
    env_extra, threads = SETTINGS[setting]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n_busy)]
    try:
        time.sleep(0.5 if busy else 0)  # the scheduler sees them before the models load
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, SPECMAC_CACHE=cache, **env_extra)
            cmd = [sys.executable, __file__, "--child", "--models-dir", str(args.models_dir), "--tokens",
                   str(args.tokens), "--rounds", str(args.rounds)]
            cmd += ["--threads", str(threads)] if threads else []
            cmd += ["--target", args.target]
            try:
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                                     timeout=args.child_timeout_s).stdout
            except subprocess.TimeoutExpired:  # a condition this slow is a result too: said, not dropped
                return {"busy": n_busy, "setting": setting, "threads": threads, "env": env_extra, "runs": [],
                        "timed_out_s": args.child_timeout_s, "median_tokens_per_second": None}
    finally:
        for b in busy:
            b.kill()
            b.wait()
    got = json.loads(out.strip().splitlines()[-1])
    med = {m: statistics.median(r["tokens_per_second"] for r in got["runs"] if r["method"] == m)
           for m in METHODS}
    return {"busy": n_busy, "setting": setting, "threads": got["threads"], "fitted": got.get("fitted"),
            "refits": got.get("refits"),
            "env": env_extra, "runs": got["runs"], "median_tokens_per_second": med}


def table(rows: list[dict]) -> list[str]:
    """One row per condition; each method's tokens/s also as a share of the first quiet setting's
    (the old default, where it ran): "keeps half its quiet speed" reads off the row."""
    quiet = {r["setting"]: r["median_tokens_per_second"] or {} for r in rows if r["busy"] == 0}
    base = next((quiet[k] for k in SETTINGS if quiet.get(k)), {})
    out = ["| busy processes | thread setting | threads used | plain tok/s | K=4 tok/s | auto tok/s | "
           "auto / plain | plain, K=4, auto vs quiet old default |", "|---:|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        m = r["median_tokens_per_second"]
        if m is None:
            out.append(f"| {r['busy']} | {r['setting']} | - | did not finish "
                       f"{len(METHODS)} x 2 rounds in {r['timed_out_s']:.0f} s | | | | |")
            continue
        rel = ", ".join(f"{m[k] / base[k]:.0%}" for k in METHODS) if base else "-"
        used = r["threads"] if not r.get("fitted") else ", ".join(
            f"{role} {why.split(' (')[0]}" for role, why in r["fitted"].items())
        out.append(f"| {r['busy']} | {r['setting']} | {used} | {m['plain']:.1f} | {m['K=4']:.1f} | "
                   f"{m['auto']:.1f} | {m['auto'] / m['plain']:.2f} | {rel} |")
    return out


def plot(rows: list[dict], path: Path) -> None:
    from specmac.compare.results import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(METHODS), figsize=(13, 3.8), sharey=True)
    for ax, method in zip(axes, METHODS):
        for i, setting in enumerate(SETTINGS):
            pts = [(r["busy"], r["median_tokens_per_second"][method]) for r in rows
                   if r["setting"] == setting and r["median_tokens_per_second"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=setting)
        ax.set_title(method)
        ax.set_xlabel("busy competing processes")
        ax.set_xticks([0, 1, 2])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens/s (median of rounds)")
    axes[-1].legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=Path("results/busy"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--busy", default="0,1,2", help="numbers of busy processes, e.g. 0,1,2")
    ap.add_argument("--target", default="gguf", help="gguf (the 1.5B Q4_K_M file) or torch:FOLDER (bf16)")
    ap.add_argument("--settings", default="fixed threads (old default),fitted threads (new default)",
                    help=f"thread settings, a comma list of: {', '.join(SETTINGS)}")
    ap.add_argument("--budget-s", type=float, default=560, help="start no condition after this many seconds")
    ap.add_argument("--child-timeout-s", type=float, default=300, help="a condition's limit (recorded)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--render", type=Path, help="redraw DIR/README.md and busy.png from DIR/busy.json")
    args = ap.parse_args()
    if args.render:
        return render(args.render)
    if args.child:
        return child(args)
    from specmac.compare.results import provenance, write_json

    command = "python bench/busy.py " + " ".join(sys.argv[1:])
    take_machine(command)  # the parent holds it; its children (one per condition) are the run
    t0, rows = time.monotonic(), []
    for n_busy in (int(x) for x in args.busy.split(",")):
        for setting in args.settings.split(","):
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget spent: {n_busy} busy / {setting} not run", file=sys.stderr)
                continue
            rows.append(condition(args, n_busy, setting))
            m = rows[-1]["median_tokens_per_second"] or {}
            print(f"{n_busy} busy, {setting}: " + (", ".join(f"{k} {v:.1f}" for k, v in m.items())
                                                   or f"timed out after {args.child_timeout_s:.0f} s"),
                  file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "busy.json", {"rows": rows, "prompt": PROMPT, "tokens": args.tokens,
                                        "rounds": args.rounds, "loadavg_after": os.getloadavg(),
                                        "provenance": provenance(command, [args.models_dir / QWEN_15B_GGUF,
                                                                           args.models_dir / QWEN_05B_GGUF])})
    render(args.out)


def render(out: Path) -> None:
    """busy.png and README.md from busy.json (``--render DIR`` redraws them without measuring)."""
    record = json.loads((out / "busy.json").read_text())
    rows, command = record["rows"], record["provenance"]["command"]
    plot(rows, out / "busy.png")
    lines = table(rows)
    print("\n".join(lines))
    load = ", ".join(f"{x:.1f}" for x in record["loadavg_after"])
    (out / "README.md").write_text("\n".join([
        "# Decoding on a busy machine", "", f"`{command}`", "",
        f"{record['tokens']} tokens per run, {record['rounds']} rounds, greedy, prompt: "
        f"{record['prompt']!r}. "
        f"Load average after the run: {load} on {os.cpu_count()} CPUs: the machine is shared with other "
        "agents, so \"0 busy processes\" is not quite quiet. \"threads used\": the count each model ran "
        "at the end, as the run's stats say it (fitted: the count chosen from the runnable tasks "
        "sampled before the run, kept fitted during it).", "", *lines, "",
        *record.get("reading", [])]) + "\n")


if __name__ == "__main__":
    main()
