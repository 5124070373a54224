"""Two checkouts of specmac on the same workload, interleaved: what a change does, per category.

    python bench/ab.py --before ../before [--models-dir DIR] --out results/planner/MACHINE/q4_k_m
    python bench/ab.py --before ../before --models-dir M --target-backend torch \
        --target-model M/qwen2.5-coder-1.5b-instruct-hf-bf16 --target-opt dtype=bfloat16 --out DIR
    (the folder: specmac models convert M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --dtype bfloat16 \
        --out M/qwen2.5-coder-1.5b-instruct-hf-bf16)

Each checkout runs in a process of its own (its specmac first on PYTHONPATH), loads the target and
the draft once, and serves one generation at a time; the driver sends every (prompt, round,
configuration) to both, one after the other, the order alternating, so the machine's drift hits
both alike. Every run starts from empty caches (target and draft). The configurations are plain
decoding and each ``--drafts`` source at ``--k``; the workload is the packaged one
(specmac/data/workload.jsonl, whole conversations) through the target's chat template,
``--per-category`` prompts of each category, greedy. ``--k auto`` measures its pass costs once
per checkout, in a cache of the run's own (the two keep theirs differently). Writes
results.json (every run, with the provenance of both checkouts), README.md (per category: each
configuration's speedup over plain decoding of its own checkout, paired per prompt and round, the
median over rounds; tokens/s beside it; the hybrid against its two sources; greedy identity with
plain) and a PNG. ``--streams N``: each run serves N prompts at once instead (the next N of those
picked), sharing every pass of the target and of a draft model as ``specmac serve`` batches N
clients (``pass_streams``), timed from their prompts to their last tokens; its row is "N streams".
Takes the machine's benchmark lock (bench/lib/machine.py): two benchmarks never
share the CPUs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
FREE = ("ngram", "lookup")


# --- the worker: one checkout's specmac, one generation at a time --------------------------------
def worker() -> None:
    """Read JSON lines on stdin ({"load": ...} once, then {"run": ...}), answer one line each."""
    import specmac.api
    from specmac.backends import load_backend
    from specmac.core.sampling import SamplingParams

    new = hasattr(specmac.api.Pair, "planner")
    # every run from empty caches, as a checkout without reuse runs: the configurations share the
    # target and the draft model, and one that found the prompt held by the run before it would skip
    # a prefill (the draft's counts in decoding) that the others pay
    fresh = {"reuse": False} if "reuse" in inspect.signature(specmac.api.Pair.stream).parameters else {}
    pairs, target = {}, None
    for line in sys.stdin:
        msg = json.loads(line)
        if "load" in msg:
            m = msg["load"]
            target = load_backend(m["target"], m["target_model"], m["target_options"] or None, role="target")
            draft = load_backend("gguf", m["draft_model"], None, role="draft") if m["draft_model"] else None
            pairs = {name: specmac.api.Pair(target, _sources(new, name, draft)) for name in m["configs"]}
            # batches: one pair over every source, a planner per configuration over its own, so the
            # configurations share one set of lanes (two pairs' lanes on one backend would not)
            every = dict.fromkeys(p for name in m["configs"] if name != "none" for p in name.split("+"))
            every = "+".join(sorted(every, key=lambda p: p not in FREE))  # the free sources first, as named
            whole = specmac.api.Pair(target, _sources(new, every, draft)) if new and every else None
            reply = {"checkout": str(Path(specmac.__file__).resolve().parent.parent), "new": new}
        elif "batch" in msg["run"]:
            r = msg["run"]
            reply = _batch(whole, target, r, r["k"] if r["config"] != "none" else 1)
        else:
            r = msg["run"]
            ids = target.encode(target.apply_chat_template(r["messages"]))
            k = r["k"] if r["config"] != "none" else 1
            g = pairs[r["config"]].generate(ids, params=SamplingParams(0.0), k=k, max_tokens=r["max_tokens"],
                                            seed=r["seed"], **fresh)
            s = g.stats
            reply = {"n_tokens": s.n_tokens, "seconds": s.seconds, "prefill_seconds": s.t_prefill,
                     "n_target_passes": s.n_target_passes, "n_drafted": s.n_drafted,
                     "n_accepted": s.n_accepted, "sources": dict(s.sources), "token_ids": g.token_ids,
                     "plain_step_s": s.plain_step_seconds, "n_plain_steps": len(s.plain_steps),
                     "n_prompt": len(ids)}
        print(json.dumps(reply), flush=True)


def _batch(pair, target, r: dict, k) -> dict:
    """Several conversations at once, sharing each pass (``pass_streams``, as the server's
    scheduler runs them), from their prompts to their last tokens: the batch's totals."""
    import time

    from specmac.core.loop import Event, pass_streams
    from specmac.core.sampling import SamplingParams

    t0 = time.perf_counter()
    mine = [] if r["config"] == "none" else r["config"].split("+")
    lanes, planner = pair.lanes(len(r["batch"])), pair.planner(k, [s for s in pair.sources if s.name in mine])
    for lane in lanes:  # every run from empty caches: the configurations share these lanes
        for b in lane.backends().values():
            b.reset()
    streams = [pair.start(lane, target.encode(target.apply_chat_template(m)), params=SamplingParams(0.0),
                          max_tokens=r["max_tokens"], k=planner, seed=r["seed"])
               for lane, m in zip(lanes, r["batch"])]
    out = {"n_tokens": 0, "n_target_passes": 0, "n_drafted": 0, "n_accepted": 0, "sources": {},
           "token_ids": [[] for _ in streams], "prefill_seconds": 0.0, "plain_step_s": None,
           "n_plain_steps": 0, "n_prompt": sum(len(s.seq) for s in streams)}
    live = list(range(len(streams)))
    while live:
        events = pass_streams(lanes[0].target, [streams[i] for i in live], planner)
        out["n_target_passes"] += 1
        for i, e in zip(list(live), events):
            if isinstance(e, Exception):
                raise e
            if isinstance(e, Event):
                out["token_ids"][i] += e.tokens
                out["n_tokens"] += len(e.tokens)
                out["n_drafted"] += e.n_drafted
                out["n_accepted"] += e.n_accepted
                out["sources"][e.source] = out["sources"].get(e.source, 0) + 1
                if e.finish_reason:
                    streams[i].close()
                    live.remove(i)
    return out | {"seconds": time.perf_counter() - t0, "costs": planner.costs.info()}


def _sources(new: bool, name: str, draft):
    """The draft sources a configuration names, in either checkout's terms."""
    from specmac.core.drafters import ModelDrafter, NgramDrafter
    from specmac.core.lookup import LookupDrafter

    parts = [] if name == "none" else name.split("+")
    made = [NgramDrafter() if p == "ngram" else LookupDrafter() if p == "lookup" else ModelDrafter(draft)
            for p in parts]
    if new:
        return made
    from specmac.core.drafters import PlainDecoding

    if len(made) == 2:
        from specmac.core.hybrid import HybridDrafter

        return HybridDrafter(LookupDrafter(), made[1], name)
    return made[0] if made else PlainDecoding()


class Checkout:
    """A worker process over one checkout."""

    def __init__(self, label: str, path: Path, cache: Path, load: dict) -> None:
        env = dict(os.environ, PYTHONPATH=str(path), SPECMAC_CACHE=str(cache))
        self.label = label
        self.proc = subprocess.Popen([sys.executable, str(HERE / "ab.py"), "--worker"], cwd=path, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self.ask({"load": load})
        self.info["git_sha"] = _git(path, "rev-parse", "HEAD")
        self.info["dirty"] = bool(_git(path, "status", "--porcelain", "--untracked-files=no"))

    def ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.label} worker ended (its error is above)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True).stdout.strip()


# --- the driver ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv) == ["--worker"]:
        return worker()  # before importing bench/lib: the worker runs under its checkout's specmac
    from lib.machine import take_machine
    from lib.models import add_models_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, help="the checkout to compare against (e.g. a git worktree)")
    ap.add_argument("--after", type=Path, default=HERE.parent,
                    help="the checkout measured (default this one)")
    add_models_dir(ap)
    ap.add_argument("--target-backend", default="gguf")
    ap.add_argument("--target-model", help=f"default: MODELS_DIR/{TARGET}")
    ap.add_argument("--target-opt", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--draft-model",
                    help=f"a GGUF file with the target's vocabulary (default MODELS_DIR/{DRAFT})")
    ap.add_argument("--drafts", default="gguf,lookup,lookup+gguf",
                    help="comma-separated draft names (plain decoding is always run)")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--categories", default="all")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--edit-tokens", type=int, default=256, help="max tokens of a code edit")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--streams", type=int, default=1,
                    help="N > 1: each run serves N prompts at once, sharing every pass (as specmac serve "
                         "batches N clients), timed from their prompts to their last tokens")
    ap.add_argument("--out", type=Path, help="the folder for results.json, README.md and the PNG")
    a = ap.parse_args(argv)
    if a.before is None or a.out is None:
        ap.error("--before CHECKOUT and --out DIR are required")
    from specmac.compare.prompts import PACKAGED_WORKLOAD, read_prompts
    from specmac.compare.results import code_measured, provenance

    target_model = a.target_model or str(a.models_dir / TARGET)
    draft_model = a.draft_model or str(a.models_dir / DRAFT)
    opts = dict(o.split("=", 1) for o in a.target_opt)
    configs = ["none", *[d for d in a.drafts.split(",") if d and d != "none"]]
    k = a.k if a.k == "auto" else int(a.k)
    prompts = pick(read_prompts(PACKAGED_WORKLOAD, turns="all"), a.per_category, a.categories)
    if a.streams > 1:  # each run: the next N prompts at once
        if len(prompts) < a.streams:
            ap.error(f"--streams {a.streams}: {len(prompts)} prompts picked (raise --per-category)")
        n = a.streams
        prompts = [{"id": "+".join(q["id"] for q in prompts[i:i + n]), "category": f"{n} streams",
                    "batch": prompts[i:i + n]} for i in range(0, len(prompts) - n + 1, n)]
    a.out.mkdir(parents=True, exist_ok=True)
    load = {"target": a.target_backend, "target_model": target_model, "target_options": opts,
            "draft_model": draft_model if any(c not in ("none", *FREE) for c in configs) else None,
            "configs": configs}
    command = shlex.join(["python", "bench/ab.py", *(argv if argv is not None else sys.argv[1:])])
    take_machine(command)
    code_measured()  # the driver's commit now: a tree edited during the run is not what was measured
    with tempfile.TemporaryDirectory() as cache:
        sides = [Checkout("before", a.before.resolve(), Path(cache) / "before", load),
                 Checkout("after", a.after.resolve(), Path(cache) / "after", load)]
        runs = measure(sides, configs, prompts, k, a)
        for s in sides:
            s.close()
    record = {"provenance": provenance(command, [target_model, draft_model]),
              "checkouts": {s.label: s.info for s in sides}, "configs": configs, "k": k,
              "prompts": {p["id"]: p["category"] for p in prompts}, "runs": runs}
    (a.out / "results.json").write_text(json.dumps(record, indent=1))
    (a.out / "README.md").write_text(report(record, a.target_backend, target_model, opts))
    plot(record, a.out / "speedup.png")
    print((a.out / "README.md").read_text())


def pick(prompts: list[dict], per_category: int, categories: str) -> list[dict]:
    want = None if categories == "all" else set(categories.split(","))
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        c = p["category"]
        if (want is None or c in want) and seen.get(c, 0) < per_category:
            seen[c] = seen.get(c, 0) + 1
            out.append(p)
    return out


def measure(sides: list[Checkout], configs: list[str], prompts: list[dict], k, a) -> list[dict]:
    """A warm-up round (discarded), then ``repeats`` rounds of every prompt and configuration on
    both checkouts, the configurations rotated and the two checkouts' order alternated."""
    def messages(p: dict) -> list[dict]:
        return p.get("messages") or [{"role": "user", "content": p["text"]}]

    def ask(side: Checkout, config: str, p: dict, r: int, n: int) -> dict:
        run = {"config": config, "max_tokens": n, "seed": max(r, 0), "k": k}
        run |= {"batch": [messages(q) for q in p["batch"]]} if "batch" in p else {"messages": messages(p)}
        return {"side": side.label, "config": config, "prompt": p["id"], "category": p["category"],
                "round": r, **side.ask({"run": run})}

    for side in sides:
        for c in configs:
            ask(side, c, prompts[0], -1, 4)
    runs, step = [], 0
    for r in range(a.repeats):
        for p in prompts:
            n = a.edit_tokens if p["category"] == "code_editing" else a.max_tokens
            for c in configs[step % len(configs):] + configs[:step % len(configs)]:
                order = sides if step % 2 == 0 else sides[::-1]
                for side in order:
                    runs.append(ask(side, c, p, r, n))
                    done = runs[-1]
                    tps = done["n_tokens"] / done["seconds"]
                    print(f"r{r} {p['id']:8s} {c:12s} {side.label:6s} {tps:6.1f} tok/s", file=sys.stderr,
                          flush=True)
                step += 1
    return runs


# --- the report ------------------------------------------------------------------------------------
def speedups(runs: list[dict], side: str, config: str, category: str | None, end_to_end: bool = False):
    """Per (prompt, round) of this side and category: the config's tokens/s over plain's."""
    def tps(x: dict) -> float:
        return x["n_tokens"] / (x["seconds"] + (x["prefill_seconds"] if end_to_end else 0.0))
    plain = {(x["prompt"], x["round"]): x for x in runs if x["side"] == side and x["config"] == "none"}
    return [tps(x) / tps(plain[x["prompt"], x["round"]]) for x in runs if x["side"] == side
            and x["config"] == config and (category is None or x["category"] == category)]


def pooled_tps(runs, side, config, category) -> float:
    rs = [x for x in runs if x["side"] == side and x["config"] == config and x["category"] == category]
    return sum(x["n_tokens"] for x in rs) / sum(x["seconds"] for x in rs)


def pooled_speedup(runs, side, config, category) -> float:
    """Plain decoding's seconds per token over the config's, pooled over the category's runs."""
    return pooled_tps(runs, side, config, category) / pooled_tps(runs, side, "none", category)


def report(record: dict, backend: str, model: str, opts: dict) -> str:
    runs, configs = record["runs"], record["configs"]
    cats = list(dict.fromkeys(record["prompts"].values()))
    drafts = [c for c in configs if c != "none"]
    cpu = record["provenance"]["machine"].get("processor") or "?"
    b, af = record["checkouts"]["before"], record["checkouts"]["after"]
    lines = [f"# Before and after, interleaved: {backend} `{Path(model).name}`"
             f"{' ' + ' '.join(f'{k}={v}' for k, v in opts.items()) if opts else ''}, K {record['k']}", "",
             f"`{record['provenance']['command']}`", "",
             f"before: {b['git_sha'][:7]}{' (dirty)' if b['dirty'] else ''}; after: {af['git_sha'][:7]}"
             f"{' (uncommitted changes)' if af['dirty'] else ''}; {cpu}; "
             f"{len(record['prompts'])} prompts ({', '.join(record['prompts'])}), "
             f"{1 + max(x['round'] for x in runs)} rounds after a warm-up, greedy.", "",
             "Speedup over plain decoding of the same checkout, pooled over the category's runs "
             "(decoding: the target's prompt prefill left out, the draft's in); in brackets the paired "
             "per-run ratios' range; tokens/s of plain decoding beside."
             + (" A row of N streams: each run serves N prompts at once, timed from their prompts to their "
                "last tokens (every prefill in)." if any(c.endswith(" streams") for c in cats) else ""), "",
             "| category | plain tok/s before / after | "
             + " | ".join(f"{d} before | {d} after" for d in drafts) + " |",
             "|---|---:|" + "---:|" * (2 * len(drafts))]
    for cat in cats:
        cells = [f"{pooled_tps(runs, s, 'none', cat):.1f}" for s in ("before", "after")]
        row = [cat, " / ".join(cells)]
        for d in drafts:
            for s in ("before", "after"):
                per = speedups(runs, s, d, cat)
                row.append(f"{pooled_speedup(runs, s, d, cat):.2f}x [{min(per):.2f}, {max(per):.2f}]")
        lines.append("| " + " | ".join(row) + " |")
    hybrids = [d for d in drafts if "+" in d and all(p in drafts for p in d.split("+"))]
    for h in hybrids:
        parts = h.split("+")
        lines += ["", f"### {h} against the best of plain and its two sources ({' , '.join(parts)})", "",
                  "| category | before | after |", "|---|---:|---:|"]
        for cat in cats:
            vals = []
            for s in ("before", "after"):
                best = max(1.0, *(pooled_speedup(runs, s, p, cat) for p in parts))
                vals.append(f"{pooled_speedup(runs, s, h, cat) / best:.2f}")
            lines.append(f"| {cat} | {' | '.join(vals)} |")
    lines += ["", "### Steps by source (after)", "", "| category | " + " | ".join(drafts) + " |",
              "|---|" + "---|" * len(drafts)]
    for cat in cats:
        row = [cat]
        for d in drafts:
            steps: dict[str, int] = {}
            for x in runs:
                if x["side"] == "after" and x["config"] == d and x["category"] == cat:
                    for src, n in x["sources"].items():
                        steps[src] = steps.get(src, 0) + n
            row.append(", ".join(f"{s} {n}" for s, n in sorted(steps.items())))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "### Greedy output equal to plain decoding's (same checkout, prompt and round)", ""]
    for s in ("before", "after"):
        mine = [x for x in runs if x["side"] == s]
        plain = {(x["prompt"], x["round"]): x["token_ids"] for x in mine if x["config"] == "none"}
        spec = [x for x in mine if x["config"] != "none"]
        differ = [x for x in spec if x["token_ids"] != plain[x["prompt"], x["round"]]]
        names = sorted({f"{x['config']} on {x['prompt']}" for x in differ})
        lines.append(f"- {s}: {len(spec) - len(differ)} of {len(spec)} runs identical"
                     + (f"; differ: {', '.join(names)}" if names else ""))
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    from specmac.compare.results import pyplot, save_figure

    plt = pyplot()
    runs, drafts = record["runs"], [c for c in record["configs"] if c != "none"]
    cats = list(dict.fromkeys(record["prompts"].values()))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cats)), 4))
    width = 0.8 / (2 * len(drafts))
    for j, d in enumerate(drafts):
        for s_i, s in enumerate(("before", "after")):
            vals = [pooled_speedup(runs, s, d, c) for c in cats]
            ax.bar(np.arange(len(cats)) + (2 * j + s_i) * width - 0.4, vals, width,
                   label=f"{d} {s}", alpha=0.5 if s == "before" else 1.0, color=f"C{j}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(cats)), cats, rotation=20)
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7, ncol=len(drafts))
    save_figure(fig, path)


if __name__ == "__main__":
    main()
