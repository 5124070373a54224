"""The anatomy of speculative decoding on this machine, with a real pair (Qwen2.5-Coder 0.5B -> 1.5B).

    python bench/anatomy.py [--models-dir DIR] --out results/anatomy
    python bench/anatomy.py --report --out results/anatomy          # tables.md and plots, no run
    python bench/anatomy.py --acceptance-by-prompts --out results/anatomy   # advise's acceptance by prompts

Draft/target configurations across backends and precisions (gguf Q4_K_M and F16, torch fp32 and
bf16 targets; gguf, torch, mlx and n-gram drafts), each at K = 1..8 and K = auto and at T = 0 and
T = 1, on the prompts of bench/lib/data/anatomy_prompts.json (code and prose; not the prompts advise
calibrates on). Per target every configuration is measured side by side by specmac.compare.measure
(interleaved rounds, each run paired with the target-only run of the same prompt and round), then
the peers on that target in alternation with their own plain decoding: HF assisted generation
(transformers ``assistant_model``) on torch targets, llama-cpp-python's prompt-lookup decoding on
the Q4_K_M target, and llama.cpp's own speculative example on gguf targets where it was built
(bench/lib/llamacpp_peer.py). Beside every cell: advise's ranking (run first, on its own prompts) and its
prediction. Writes results.json; ``--report`` writes tables.md and the PNG plots from it
(bench/lib/anatomy_report.py), ``--acceptance-by-prompts`` acceptance_by_prompts.json
(bench/lib/acceptance_prompts.py). README.md is the reading, written by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from lib.llamacpp_peer import ENV, EXAMPLE, find_example, speculative_peer
from lib.machine import take_machine
from lib.models import QWEN_05B_GGUF, QWEN_15B_GGUF, add_models_dir

from specmac.advise.rank import rank_configurations
from specmac.backends import load_backend, missing_requirements
from specmac.compare.measure import AUTO, Loaded, PairSpec, Settings, aggregate, measure
from specmac.compare.prompts import advise_prompts, read_prompts
from specmac.compare.results import provenance, write_json
from specmac.core.drafters import Drafter, ModelDrafter, NgramDrafter
from specmac.core.sampling import SamplingParams
from specmac.probes import probe_parallelism

HERE = Path(__file__).resolve().parent
TARGETS = {  # name: backend, model, options, precision group (same weights, same precision)
    "gguf-q4": ("gguf", QWEN_15B_GGUF, {}, "Q4_K_M"),
    "gguf-f16": ("gguf", QWEN_15B_GGUF, {"quant": "f16"}, "F16"),
    "torch-bf16": ("torch", QWEN_15B_GGUF, {"dtype": "bfloat16"}, "bfloat16"),
    "torch-fp32": ("torch", QWEN_15B_GGUF, {"dtype": "float32"}, "float32"),
}
DRAFTS = {
    "gguf-q4": ("gguf", QWEN_05B_GGUF, {}),
    "torch-bf16": ("torch", QWEN_05B_GGUF, {"dtype": "bfloat16"}),
    "mlx-fp32": ("mlx", QWEN_05B_GGUF, {"dtype": "float32"}),
    "ngram": None,
}
# an mlx draft pass of the 0.5B costs ~250 ms on this CPU (c ~ 3 against F16): wider K cost minutes
# per run and cannot pay, so that configuration is measured at K = 1, 2 and auto only; a torch fp32
# pass of the 1.5B costs 0.6-5 s, so that target gets K = 1, 2, 3, 4, 6, 8 and auto
KS_OF = {("mlx-fp32", "gguf-f16"): [1, 2], ("gguf-q4", "torch-fp32"): [1, 2, 3, 4, 6, 8]}
CONFIGS = [  # (draft, target)
    ("gguf-q4", "gguf-q4"), ("ngram", "gguf-q4"),
    ("gguf-q4", "gguf-f16"), ("mlx-fp32", "gguf-f16"),
    ("gguf-q4", "torch-bf16"), ("torch-bf16", "torch-bf16"),
    ("gguf-q4", "torch-fp32"),
]


def load_draft(name: str, models: Path) -> Drafter:
    if DRAFTS[name] is None:
        return NgramDrafter()
    backend, model, opts = DRAFTS[name]
    return ModelDrafter(load_backend(backend, str(models / model), opts, role="draft"))


def peers(target_name: str, target, drafts: dict, prompts: list[dict], params: SamplingParams,
          max_tokens: int, ks: list[int], models: Path, llama_cpp_bin: str | None = None) -> list[dict]:
    """The libraries' own speculative decoding on this target, each beside its own plain decoding."""
    out = []
    if target.name == "torch":
        for dname, d in drafts.items():
            if d.backend is not None and d.backend.name == "torch":
                out += _hf_assisted(target, d.backend, dname, prompts, params, max_tokens)
    if target.name == "gguf" and target_name == "gguf-q4":
        out += _prompt_lookup(models / QWEN_15B_GGUF, prompts, params, max_tokens, ks)
    example = find_example(llama_cpp_bin)
    if target.name == "gguf" and example is not None:
        path = models / QWEN_15B_GGUF
        if TARGETS[target_name][2].get("quant"):
            from specmac.backends.gguf import requantize

            path = requantize(path, TARGETS[target_name][2]["quant"])[0]
        out += speculative_peer(example, path, models / QWEN_05B_GGUF, prompts, params, max_tokens,
                                [k for k in (4, 8) if k in ks] or ks[-1:])
    elif target.name == "gguf":
        print(f"  {EXAMPLE} not built: left out (see bench/lib/llamacpp_peer.py)", file=sys.stderr)
    return out


def _timed_runs(methods: dict, prompts: list[dict], max_tokens: int) -> dict:
    """Alternate the methods on every prompt; tokens/s per method over all prompts."""
    tot = {m: [0, 0.0] for m in methods}
    for p in prompts:
        for name, fn in methods.items():
            t0 = time.perf_counter()
            n = fn(p["text"], max_tokens)
            tot[name][0] += n
            tot[name][1] += time.perf_counter() - t0
    return {m: n / s for m, (n, s) in tot.items()}


def _hf_assisted(target, draft, dname: str, prompts, params, max_tokens) -> list[dict]:
    import torch

    tok = target.tokenizer
    sample = {"do_sample": True, "temperature": params.temperature or 1.0, "top_k": 0} \
        if not params.greedy else {"do_sample": False}

    def gen(assistant):
        def fn(text, n):
            ids = torch.tensor([tok.encode(text)])
            with torch.inference_mode():
                out = target.model.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                            assistant_model=assistant, pad_token_id=tok.eos_token_id,
                                            **sample)
            return out.shape[1] - ids.shape[1]
        return fn

    rates = _timed_runs({"plain": gen(None), "assisted": gen(draft.model)}, prompts, max_tokens)
    return [{"peer": f"HF assisted generation ({dname} assistant)",
             "target_tokens_per_second": rates["plain"], "tokens_per_second": rates["assisted"],
             "speedup": rates["assisted"] / rates["plain"]}]


def _prompt_lookup(path: Path, prompts, params, max_tokens, ks) -> list[dict]:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from specmac.backends.gguf_files import peer_llama as Llama  # extra buffer types off on AMX builds

    kw = {"temperature": params.temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    out = []
    for k in (2, 10):  # 10 is llama-cpp-python's default num_pred_tokens
        llms = {"plain": Llama(str(path), n_ctx=2048, verbose=False),
                "lookup": Llama(str(path), n_ctx=2048, verbose=False,
                                draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k))}

        def fn(llm):
            return lambda text, n: llm(text, max_tokens=n, seed=0, **kw)["usage"]["completion_tokens"]

        rates = _timed_runs({m: fn(llm) for m, llm in llms.items()}, prompts, max_tokens)
        out.append({"peer": f"llama-cpp-python prompt lookup (num_pred_tokens={k})",
                    "target_tokens_per_second": rates["plain"], "tokens_per_second": rates["lookup"],
                    "speedup": rates["lookup"] / rates["plain"]})
        del llms
    return out


def measure_target(name: str, configs: list, args, prompts: list[dict], params: SamplingParams) -> dict:
    backend, model, opts, group = TARGETS[name]
    t0 = time.perf_counter()
    target = load_backend(backend, str(args.models_dir / model), opts, role="target")
    print(f"{name}: loaded in {time.perf_counter() - t0:.0f} s; probing parallelism", file=sys.stderr)
    probe = probe_parallelism(target, n_max=9, context=64, repeats=2)
    drafts = {d: load_draft(d, args.models_dir) for d, t in configs if t == name}
    loaded = Loaded({name: target}, drafts)
    by_ks: dict[tuple, list[str]] = {}  # drafts measured together share a K list (and a baseline)
    for d in drafts:
        by_ks.setdefault(tuple(args.ks_of.get((d, name), KS_OF.get((d, name), args.ks))), []).append(d)
    runs, rows = [], []
    for ks, names in by_ks.items():
        settings = Settings(pairs=[PairSpec(d, name) for d in names], ks=[*ks, AUTO], prompts=prompts,
                            params=params, max_tokens=args.max_tokens, repeats=args.repeats, seed=0,
                            warmup_tokens=4)
        print(f"{name}: measuring {len(settings.configs())} configurations at T = {params.temperature}",
              file=sys.stderr)
        got, _ = measure(settings, loaded)
        runs += got
        rows += [r for r in aggregate(got, params.greedy) if not (rows and r["draft"] == "none")]
    for r in rows:
        if r["k"] == AUTO:  # the K its steps chose, from the runs' own records
            histories = [run["k_steps"] for run in runs if run["config"] == r["config"]]
            ks = [k for h in histories for k in h]
            r["k_chosen_median"] = statistics.median(ks) if ks else None
            r["share_no_drafts"] = ks.count(0) / len(ks) if ks else None
            r["k_histories"] = histories
    peer_rows = [] if args.skip_peers else peers(name, target, drafts, prompts, params, args.max_tokens,
                                                 args.ks, args.models_dir, args.llama_cpp_bin)
    return {"target": name, "group": group, "backend": backend, "options": opts,
            "temperature": params.temperature, "probe": probe, "results": rows, "runs": runs,
            "peers": peer_rows, "backend_info": target.info()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir(ap)
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "anatomy")
    ap.add_argument("--targets", default=",".join(TARGETS), help="targets to measure, comma-separated")
    ap.add_argument("--ks", default="1-8")
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--prompts", default=str(HERE / "lib" / "data" / "anatomy_prompts.json"))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--llama-cpp-bin", default=None, metavar="DIR",
                    help=f"llama.cpp's build/bin with {EXAMPLE} (default ${ENV}; "
                    "see bench/lib/llamacpp_peer.py)")
    ap.add_argument("--skip-advise", action="store_true")
    ap.add_argument("--config", action="append", default=[], metavar="DRAFT:TARGET=KS",
                    help="measure only these configurations, each at these K (and auto; KS 'auto': "
                    "auto and plain only), e.g. ngram:gguf-q4=1; repeatable")
    ap.add_argument("--advise-only", action="store_true",
                    help="redo advise's rankings at --temps in OUT/results.json (e.g. after a busy run)")
    ap.add_argument("--advise-on-anatomy-prompts", action="store_true",
                    help="with --advise-only: rank with the anatomy's prompts instead of advise's own, "
                    "kept apart in results.json (what advise predicts given texts like the user's)")
    ap.add_argument("--append", action="store_true",
                    help="add to OUT/results.json: keep its advise rankings and the measured cells of "
                    "other targets and temperatures")
    ap.add_argument("--report", action="store_true",
                    help="only write OUT/tables.md and the plots from OUT/results.json (no run)")
    ap.add_argument("--acceptance-by-prompts", action="store_true",
                    help="only write OUT/acceptance_by_prompts.json: advise's acceptance on its own prompts "
                    "and on --prompts beside what OUT/results.json measured (timing not read: no lock)")
    args = ap.parse_args()
    if args.report:
        from lib.anatomy_report import main as report

        return report(str(args.out))
    if args.acceptance_by_prompts:
        from lib.acceptance_prompts import acceptance_by_prompts

        return acceptance_by_prompts(args.models_dir, args.out, args.prompts)
    from specmac.compare.measure import parse_ks

    args.ks = parse_ks(args.ks)
    args.ks_of = {}
    for spec in args.config:  # DRAFT:TARGET=KS, KS "auto" for K = auto and plain only
        pair, _, ks = spec.partition("=")
        d, _, t = pair.partition(":")
        if (d, t) not in CONFIGS or not ks:
            ap.error(f"--config {spec!r}: write DRAFT:TARGET=KS, a pair of {CONFIGS}, KS e.g. 1,4 or auto")
        args.ks_of[d, t] = [] if ks == "auto" else parse_ks(ks)
    prompts = read_prompts(args.prompts)
    targets = [t for t in args.targets.split(",") if t]
    if args.ks_of:  # only the configurations named, and their targets
        targets = list(dict.fromkeys(t for _, t in args.ks_of))
    configs = [c for c in CONFIGS if c[1] in targets and (not args.ks_of or c in args.ks_of) and all(
        not missing_requirements(b) for b in {TARGETS[c[1]][0], (DRAFTS[c[0]] or ("gguf",))[0]})]
    record: dict = {"configs": [list(c) for c in configs], "ks": args.ks, "max_tokens": args.max_tokens,
                    "repeats": args.repeats, "prompts": [p["id"] for p in prompts], "measured": []}
    command = " ".join([Path(sys.executable).name, *sys.argv])
    models = [args.models_dir / QWEN_05B_GGUF, args.models_dir / QWEN_15B_GGUF]
    record["provenance"] = provenance(command, models)
    take_machine(command)
    out = args.out
    key = "advise_on_anatomy_prompts" if args.advise_on_anatomy_prompts else "advise"
    if args.advise_on_anatomy_prompts and not args.advise_only:
        ap.error("--advise-on-anatomy-prompts goes with --advise-only")
    if args.advise_only:
        record = json.loads((out / "results.json").read_text())
        args.skip_advise = False
        record[key] = [r for r in record.get(key, [])
                       if r["sampling"]["temperature"] not in {float(t) for t in args.temps.split(",")}]
        record["provenance"].setdefault("earlier_commands", []).append(command)
    elif args.append and (out / "results.json").is_file():
        old = json.loads((out / "results.json").read_text())
        record["measured"] = old.get("measured", [])
        both = old.get("configs", []) + record["configs"]
        record["configs"] = [list(c) for c in dict.fromkeys(map(tuple, both))]
        if old.get("advise"):
            record["advise"] = old["advise"]
            args.skip_advise = True
        record["provenance"]["earlier_commands"] = [old["provenance"]["command"],
                                                    *old["provenance"].get("earlier_commands", [])]
    if not args.skip_advise:
        from specmac.backends.gguf import requantize

        f16 = requantize(args.models_dir / QWEN_15B_GGUF, "f16")[0]  # the F16 target's file (cached)
        for temp in (float(t) for t in args.temps.split(",")):
            print(f"advise ranking at T = {temp}", file=sys.stderr)
            record.setdefault(key, []).append(rank_configurations(
                [str(args.models_dir / QWEN_05B_GGUF)], [str(args.models_dir / QWEN_15B_GGUF), str(f16)],
                params=SamplingParams(temp), backends=["gguf", "torch"],
                prompts=[p["text"] for p in prompts] if args.advise_on_anatomy_prompts else advise_prompts(),
                draft_backends=["gguf", "torch", "mlx"], k_max=8, run_tokens=32,
                notify=lambda m: print(f"  {m}", file=sys.stderr)))
            write_json(out / "results.json", record)
    for name in [] if args.advise_only else targets:
        for temp in (float(t) for t in args.temps.split(",")):
            m = measure_target(name, configs, args, prompts, SamplingParams(temp))
            # with --append, a target measured again at a temperature replaces its old cells
            record["measured"] = [x for x in record["measured"]
                                  if (x["target"], x["temperature"]) != (name, temp)] + [m]
            write_json(out / "results.json", record)  # what was measured survives a later failure
    record[key] = sorted(record.get(key, []), key=lambda r: r["sampling"]["temperature"])
    record["complete"] = True
    write_json(out / "results.json", record)
    print(json.dumps({"wrote": str(out / "results.json")}))


if __name__ == "__main__":
    main()
