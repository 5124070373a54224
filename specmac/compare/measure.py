"""``specmac compare``: every draft/target pairing and a sweep of K, measured side by side in one run.

Each target backend is loaded once and serves all its drafters plus its own plain decoding
(``Pair`` resets the target at the start of every generation, so no cache survives between runs).
Runs are interleaved: every round (one prompt, one repeat) measures every configuration once, so
slow drift on a busy machine hits all of them alike, each round starting one configuration further
along the plan (``rotated``), so no configuration always runs first or right after another; a
warm-up round is run first and discarded.
Speedup is paired: each run is divided by the plain run of the same target, prompt and round.

The record (``results.json``) holds the raw runs, the per-configuration aggregates, the cost
model's prediction for every pairing and the provenance; ``render`` turns it into ``summary.md``
and PNG plots (``specmac.compare.report``), so ``specmac report`` can redraw them without re-running anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specmac.advise.pairing import advise_pair
from specmac.api import Pair
from specmac.backends import BaseBackend, load_backend
from specmac.compare.categories import by_category, hybrid_checks, normalised_speedup
from specmac.compare.prompts import N_ADVISE as ADVISE_PROMPTS
from specmac.compare.results import provenance
from specmac.compare.settings import (  # noqa: F401  (compare's settings, re-exported)
    AUTO,
    BACKEND_KEYS,
    FORMAT,
    PLAIN,
    Config,
    PairSpec,
    Settings,
    backend_settings,
    check_table,
    fixed_ks,
    model_and_options,
    parse_ks,
    parse_pair,
    parse_pairs,
    read_config,
)
from specmac.core.drafters import Drafter, ModelDrafter
from specmac.core.runstats import RunStats
from specmac.core.sources import FREE as MODEL_FREE
from specmac.core.sources import load_sources
from specmac.errors import BadOption, SpecmacError, VocabMismatch
from specmac.vocab import check_compatible


@dataclass
class Loaded:
    targets: dict[str, BaseBackend]
    drafters: dict[str, list[Drafter]]  # draft name -> its sources
    skipped: list[dict] = field(default_factory=list)  # pairings dropped: {"pair", "reason"}

    def pair(self, c: Config) -> Pair:
        return Pair(self.targets[c.target], [] if c.plain else self.drafters[c.draft])

    def backends(self) -> dict[str, dict]:
        """"target:gguf" / "draft:mlx" -> backend info (model, library, resolved options)."""
        out = {f"target:{n}": b.info() for n, b in self.targets.items()}
        for n, d in self.drafters.items():
            many = {"drafter": n, "sources": [x.info() for x in d]}
            out[f"draft:{n}"] = d[0].info() if len(d) == 1 else many
        return out


def load_models(settings: Settings) -> Loaded:
    """Load each target backend and each draft backend once; check every pairing's vocabularies.
    With ``settings.skip_unpairable`` (every combination, none named), a pairing whose vocabularies
    differ is dropped from ``settings.pairs`` and listed in ``Loaded.skipped``; else it is an error."""
    be = settings.backends
    unused = set(be) - {p.target for p in settings.pairs} - {p.draft_backend for p in settings.pairs}
    if unused:
        raise BadOption(f"models or options given for {', '.join(sorted(unused))}, which no pair uses",
                        param="pairs")
    targets = {t: load_backend(t, *model_and_options(be, t, "target"), role="target")
               for t in dict.fromkeys(p.target for p in settings.pairs)}
    drafters: dict[str, list[Drafter]] = {}
    skipped: list[dict] = []
    for p in list(settings.pairs):
        try:
            if p.draft not in drafters:  # loaded once, its vocabulary checked against its first target
                drafters[p.draft] = _load_drafter(settings, p, targets)
            for source in drafters[p.draft]:
                if source.backend is not None:
                    check_compatible(source.backend.vocab, targets[p.target].vocab)
        except VocabMismatch as e:
            if not settings.skip_unpairable:
                raise
            skipped.append({"pair": p.id, "reason": str(e)})
            settings.pairs.remove(p)
    if not settings.pairs:
        raise BadOption("no two backends here can pair (their vocabularies differ): "
                        + "; ".join(f"{s['pair']}: {s['reason']}" for s in skipped), param="pairs")
    used = {p.draft for p in settings.pairs}
    return Loaded({t: b for t, b in targets.items() if t in {p.target for p in settings.pairs}},
                  {d: x for d, x in drafters.items() if d in used}, skipped)


def _load_drafter(settings: Settings, p: PairSpec, targets: dict[str, BaseBackend]) -> list[Drafter]:
    be = settings.backends
    if p.draft in MODEL_FREE and p.draft in be:
        raise BadOption(f"the {p.draft} drafter takes no model or options: drop them", param="pairs")
    model, options = model_and_options(be, p.draft_backend, "draft")
    if settings.skip_unpairable and p.draft not in MODEL_FREE and p.draft_backend == p.draft:
        # checked per pairing by the caller
        return [ModelDrafter(load_backend(p.draft, model, options or None, role="draft"))]
    return load_sources(p.draft, model, options or None, target_vocab=targets[p.target].vocab)


# --- measuring ----------------------------------------------------------------------------------

def measure(settings: Settings, loaded: Loaded, progress: Callable[[str], None] | None = None,
            on_round: Callable[[list[dict]], None] | None = None) -> tuple[list[dict], bool]:
    """Warm up every configuration, then run rounds (repeat x prompt) over all of them, each run
    from empty caches: configurations share backends (a hybrid's draft model is the model draft's
    too), and one that found the prompt held by the run before it would skip a prefill the others
    pay.
    Returns (runs, interrupted): Ctrl-C stops early and keeps the complete rounds. ``on_round``
    gets the runs so far after every complete round (to save them as the measurement goes)."""
    configs = settings.configs()
    pairs = {c.id: loaded.pair(c) for c in configs}
    ids = {t: [b.encode(settings.prompt_text(b, p)) for p in settings.prompts]
           for t, b in loaded.targets.items()}
    tick = progress or (lambda _desc: None)
    for c in configs:  # warm-up: kernels, allocations, lazy compilation; not recorded
        pairs[c.id].generate(ids[c.target][0], params=settings.params, k=c.k_arg, seed=settings.seed,
                             max_tokens=min(settings.warmup_tokens, settings.max_tokens), reuse=False)
        tick(f"warm-up {c.id}")
    runs: list[dict] = []
    try:
        for r in range(settings.repeats):
            for i, prompt in enumerate(settings.prompts):
                seed = settings.seed + 1000 * r + i  # the same seed for every configuration
                rnd = []
                for c in rotated(configs, r * len(settings.prompts) + i):
                    g = pairs[c.id].generate(ids[c.target][i], params=settings.params, k=c.k_arg,
                                             max_tokens=prompt.get("max_tokens", settings.max_tokens),
                                             seed=seed, reuse=False)
                    rnd.append(run_record(c, prompt["id"], r, seed, g.stats, g.token_ids)
                               | {"category": prompt.get("category", ""),
                                  "threads": pairs[c.id].threads_now()})
                    tick(f"{c.id} {prompt['id']} r{r + 1}")
                runs += rnd
                if on_round is not None:
                    on_round(runs)
    except KeyboardInterrupt:
        return runs, True
    return runs, False


def rotated(configs: list[Config], n: int) -> list[Config]:
    """The plan's configurations starting at the n-th (mod their number): round n's order. In a
    fixed order the configuration that runs first in every round finds the caches and the CPU's
    clock as no other does, and its steps are not comparable with theirs."""
    n %= max(len(configs), 1)
    return configs[n:] + configs[:n]


def run_record(c: Config, prompt: str, repeat: int, seed: int, s: RunStats, token_ids: list[int]) -> dict:
    """One generation, with the raw counts that aggregates are recomputed from."""
    return {"config": c.id, "draft": c.draft, "target": c.target, "k": c.k, "prompt": prompt,
            "round": repeat, "seed": seed, "n_tokens": s.n_tokens, "n_target_passes": s.n_target_passes,
            "n_drafted": s.n_drafted, "n_accepted": s.n_accepted, "reached": list(s.reached),
            "accepted_at": list(s.accepted_at), "t_draft": s.t_draft, "t_verify": s.t_target,
            "t_other": s.t_other, "t_prefill": s.t_prefill, "cached_tokens": s.cached_tokens,
            "draft_caught_up": s.draft_caught_up, "seconds": s.seconds,
            "tokens_per_second": s.tokens_per_second,
            "finish_reason": s.finish_reason, "sources": dict(s.sources),
            "plain_step_s": s.plain_step_seconds, "n_plain_steps": len(s.plain_steps),
            **({"k_steps": s.k_steps} if c.k == AUTO else {}),
            "output_sha1": hashlib.sha1(json.dumps(token_ids).encode()).hexdigest()[:12]}


# --- aggregating --------------------------------------------------------------------------------

def spread(values: Sequence[float]) -> dict | None:
    """Median, quartiles and range of ``values`` (None when there are none)."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if not len(v):
        return None
    q = np.percentile(v, [0, 25, 50, 75, 100])
    return {"median": float(q[2]), "p25": float(q[1]), "p75": float(q[3]), "min": float(q[0]),
            "max": float(q[4]), "n": int(len(v))}


def aggregate(runs: list[dict], greedy: bool) -> list[dict]:
    """Per configuration (in first-seen order): tokens/s, paired speedup over the same target's
    baseline, pooled acceptance, tokens per target pass, per-position acceptance, time split."""
    base = {(r["target"], r["prompt"], r["round"]): r for r in runs if r["draft"] == PLAIN}
    by_config: dict[str, list[dict]] = {}
    for r in runs:
        by_config.setdefault(r["config"], []).append(r)
    return [_aggregate_one(rs, base, greedy) for rs in by_config.values()]


def _aggregate_one(rs: list[dict], base: dict, greedy: bool) -> dict:
    first = rs[0]
    paired = [(r, base.get((r["target"], r["prompt"], r["round"]))) for r in rs]
    ratios = [r["tokens_per_second"] / b["tokens_per_second"] for r, b in paired
              if b and r["tokens_per_second"] and b["tokens_per_second"]]
    drafted, accepted = sum(r["n_drafted"] for r in rs), sum(r["n_accepted"] for r in rs)
    passes, tokens = sum(r["n_target_passes"] for r in rs), sum(r["n_tokens"] for r in rs)
    seconds = sum(r["seconds"] for r in rs)
    spec = first["draft"] != PLAIN
    out = {"config": first["config"], "draft": first["draft"], "target": first["target"], "k": first["k"],
           "n_runs": len(rs), "n_tokens": tokens, "seconds": seconds,
           "tokens_per_second": spread([r["tokens_per_second"] for r in rs]),
           "speedup": spread(ratios),
           # each run's speed in units of its own plain steps, where it made enough of them to time
           # the machine (specmac.compare.categories.normalised_speedup)
           "speedup_normalised": spread([normalised_speedup(r, b) for r, b in paired]) if spec else None,
           "acceptance_rate": accepted / drafted if spec and drafted else None,
           "tokens_per_target_pass": tokens / passes if spec and passes else None,
           "per_position_acceptance": _per_position(rs) if spec else None,
           "time_split": {part: (sum(r[f"t_{part}"] for r in rs) / seconds if seconds else None)
                          for part in ("draft", "verify", "other")},
           "greedy_match": None}
    if greedy and spec:  # at T=0 the speculative output must equal the target's own
        same = [r["output_sha1"] == b["output_sha1"] for r, b in paired if b]
        out["greedy_match"] = sum(same) / len(same) if same else None
    return out


def diagnose_greedy(results: list[dict], runs: list[dict], settings: Settings, loaded: Loaded) -> None:
    """Where a greedy run's output differs from the plain run's: at which token they part and
    whether it is a near-tie flip (see specmac.lossless.greedy), once per (configuration, prompt).
    Adds greedy_mismatches and greedy_unexplained (mismatches no rounding explains) to each row."""
    from specmac.lossless.greedy import diagnose

    base = {(r["target"], r["prompt"], r["round"]): r["output_sha1"] for r in runs if r["draft"] == PLAIN}
    prompts = {p["id"]: p for p in settings.prompts}
    for row in results:
        if row.get("greedy_match") in (None, 1.0):
            continue
        c = Config(row["draft"], row["target"], row["k"])
        bad = dict.fromkeys(r["prompt"] for r in runs if r["config"] == row["config"]
                            and r["output_sha1"] != base.get((r["target"], r["prompt"], r["round"])))
        pair = loaded.pair(c)
        found = [diagnose(pair, pair.encode(settings.prompt_text(pair.target, prompts[p])), k=c.k_arg,
                          max_tokens=prompts[p].get("max_tokens", settings.max_tokens))
                 | {"prompt": p} for p in bad]
        row["greedy_mismatches"] = [d for d in found if not d["match"]]  # a mismatch may not reproduce
        row["greedy_unexplained"] = sum(not d["near_tie"] for d in row["greedy_mismatches"])


def _per_position(rs: list[dict]) -> list[float | None]:
    n = max((len(r["reached"]) for r in rs), default=0)
    reached, acc = np.zeros(n), np.zeros(n)
    for r in rs:
        reached[: len(r["reached"])] += r["reached"]
        acc[: len(r["accepted_at"])] += r["accepted_at"]
    return [float(a / m) if m else None for a, m in zip(acc, reached)]


# --- the cost model's prediction ----------------------------------------------------------------

def predict(settings: Settings, loaded: Loaded) -> dict[str, dict]:
    """advise_pair() for every pairing, made before the measurement: pairing id -> its answer (or
    {"error": ...} when the cost model cannot say, e.g. a probe that fails on this backend).
    Acceptance comes from the first ADVISE_PROMPTS prompts of the run's set."""
    out = {}
    for p in settings.pairs:
        pair = loaded.pair(Config(p.draft, p.target, 1))
        try:
            texts = [settings.prompt_text(pair.target, q) for q in settings.prompts[:ADVISE_PROMPTS]]
            out[p.id] = advise_pair(pair, params=settings.params, k_max=max(fixed_ks(settings.ks), default=8),
                                    seed=settings.seed, prompts=texts)
        except (SpecmacError, ValueError) as e:
            out[p.id] = {"error": str(e)}
    return out


def attach_predictions(results: list[dict], predictions: dict[str, dict]) -> None:
    """Put advise's predicted speedup and tokens per pass beside each measured configuration."""
    for row in results:
        adv = predictions.get(f"{row['draft']}:{row['target']}") or {}
        hit = next((t for t in adv.get("table", []) if t.get("k") == row["k"]), None)
        row["predicted_speedup"] = hit.get("predicted_speedup") if hit else None
        row["predicted_tokens_per_pass"] = hit.get("tokens_per_pass") if hit else None


# --- the whole command --------------------------------------------------------------------------

def run_compare(settings: Settings, *, command: str | None = None,
                progress: Callable[[str], None] | None = None,
                status: Callable[[str], None] | None = None,
                checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Load, predict, measure, aggregate: the record that ``results.json`` holds. ``progress`` is
    called after each generation (``Settings.n_runs`` in all), ``status`` at each phase and
    ``checkpoint`` with the record of the rounds so far after each round ("complete": false), so a
    late failure or a kill leaves what was measured."""
    if not settings.pairs:
        raise BadOption("pairs is empty: give at least one pairing DRAFT:TARGET", param="pairs")
    say = status or (lambda _desc: None)
    say("loading models")
    loaded = load_models(settings)
    for sk in loaded.skipped:
        say(f"skipped {sk['pair']}: {sk['reason']}")
    backends = loaded.backends()
    # hash the model files now: they are what was loaded, even if a file changes during the run
    prov = provenance(command, models=list(dict.fromkeys(model_path(i) for i in backends.values()
                                                         if i.get("model"))))
    prov["backend_options"] = {role: i.get("options", {}) for role, i in backends.items()}
    say("cost model (advise)")
    predictions = predict(settings, loaded)

    def record(runs: list[dict], interrupted: bool, complete: bool) -> dict:
        results = aggregate(runs, settings.params.greedy)
        if complete and settings.params.greedy:
            diagnose_greedy(results, runs, settings, loaded)
        attach_predictions(results, predictions)
        cats = by_category(runs)
        return {"format": FORMAT, "provenance": prov, "settings": settings.to_dict(), "backends": backends,
                "interrupted": interrupted, "complete": complete, "predictions": predictions,
                "skipped_pairs": loaded.skipped, "results": results, "categories": cats,
                "hybrid_checks": hybrid_checks(cats), "runs": runs}

    save = None if checkpoint is None else (lambda runs: checkpoint(record(runs, False, False)))
    runs, interrupted = measure(settings, loaded, progress, save)
    if not runs:
        raise SpecmacError("interrupted before the first round was complete: nothing to report")
    return record(runs, interrupted, not interrupted)


def model_path(info: dict) -> str:
    """The file or folder a backend loaded: a resolved "path" option (e.g. the embedded GGUF,
    whose model id is a name) wins over the model id, so provenance can hash it."""
    path = (info.get("options") or {}).get("path")
    return str(path) if path and Path(path).exists() else str(info["model"])
