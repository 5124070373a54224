"""``specmac compare``: every draft/target pairing and a sweep of K, measured side by side in one run.

Each target backend is loaded once and serves all its drafters plus its own target-only baseline
(``Pair`` resets the target at the start of every generation, so no cache survives between runs).
Runs are interleaved: every round (one prompt, one repeat) measures every configuration once, so
slow drift on a busy machine hits all of them alike; a warm-up round is run first and discarded.
Speedup is paired: each run is divided by the target-only run of the same target, prompt and round.

The record (``results.json``) holds the raw runs, the per-configuration aggregates, the cost
model's prediction for every pairing and the provenance; ``render`` turns it into ``summary.md``
and PNG plots, so ``specmac report`` can redraw them without re-running anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specmac.api import Pair
from specmac.backends import BaseBackend, load_backend, registry
from specmac.drafters import Drafter, ModelDrafter, NgramDrafter
from specmac.errors import BadOption, SpecmacError
from specmac.metrics import RunStats
from specmac.sampling import SamplingParams
from specmac.vocab import check_compatible

BASELINE = "none"  # the "drafter" of a target-only configuration
MODEL_FREE = ("ngram",)
ROLES = ("draft", "target")
BACKEND_KEYS = ("draft_model", "target_model", "options", "draft_options", "target_options")
FORMAT = "specmac.compare/1"


# --- what to run ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PairSpec:
    """A pairing to measure: draft backend (or "ngram") -> target backend."""

    draft: str
    target: str

    @property
    def id(self) -> str:
        return f"{self.draft}:{self.target}"


@dataclass(frozen=True)
class Config:
    """One measured configuration: a pairing at one K, or a target-only baseline (k = 0)."""

    draft: str
    target: str
    k: int

    @property
    def id(self) -> str:
        return f"{BASELINE}:{self.target}" if self.baseline else f"{self.draft}:{self.target}:k{self.k}"

    @property
    def baseline(self) -> bool:
        return self.draft == BASELINE


@dataclass
class Settings:
    """Everything ``run_compare`` needs; ``backends`` maps a backend name to its model and options
    (keys of BACKEND_KEYS, as read from the TOML config and the command line)."""

    pairs: list[PairSpec]
    ks: list[int]
    prompts: list[dict]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(0.0))
    max_tokens: int = 64
    repeats: int = 3
    seed: int = 0
    warmup_tokens: int = 8
    backends: dict[str, dict] = field(default_factory=dict)

    def configs(self) -> list[Config]:
        """Grouped by target: its baseline, then each of its pairings at every K (measuring
        order within a round, so a baseline sits next to the runs it is compared with)."""
        out = []
        for target in dict.fromkeys(p.target for p in self.pairs):
            out.append(Config(BASELINE, target, 0))
            out += [Config(p.draft, target, k) for p in self.pairs if p.target == target for k in self.ks]
        return out

    def n_runs(self) -> int:
        """Generations run in total, the warm-up round included (for a progress bar)."""
        return len(self.configs()) * (1 + len(self.prompts) * self.repeats)

    def to_dict(self) -> dict:
        return {"pairs": [p.id for p in self.pairs], "k": list(self.ks),
                "prompts": [p["id"] for p in self.prompts], "sampling": self.params.to_dict(),
                "max_tokens": self.max_tokens, "repeats": self.repeats, "seed": self.seed,
                "warmup_tokens": self.warmup_tokens, "backends": self.backends}


def parse_pair(text: str) -> PairSpec:
    """"DRAFT:TARGET" -> PairSpec; DRAFT is a backend or "ngram", TARGET a backend."""
    draft, sep, target = text.strip().partition(":")
    if not sep or not draft or not target:
        raise BadOption(f"--pair {text!r} is not DRAFT:TARGET: write e.g. --pair mlx:gguf")
    names = registry()
    for role, name in (("draft", draft), ("target", target)):
        if name not in names and not (role == "draft" and name in MODEL_FREE):
            extra = " or ngram" if role == "draft" else ""
            raise BadOption(f"--pair {text!r}: unknown {role} backend {name!r}; choose one of "
                            f"{', '.join(sorted(names))}{extra}")
    return PairSpec(draft, target)


def parse_pairs(texts: Sequence[str]) -> list[PairSpec]:
    """Every --pair, in order and without repeats; none (or "all") means every combination of the
    installed model backends (synthetic left out), plus ngram -> each of them."""
    if not texts or "all" in texts:
        from specmac.backends import missing_requirements

        real = [n for n in registry() if n != "synthetic" and not missing_requirements(n)]
        if not real:
            raise BadOption("no model backend is installed: pip install 'specmac[all]' or give --pair")
        texts = [*(t for t in texts if t != "all"), *(f"{d}:{t}" for t in real for d in [*real, "ngram"])]
    return list(dict.fromkeys(parse_pair(t) for t in texts))


def parse_ks(text: str) -> list[int]:
    """"1,2,4" or "1-8" (or a mix) -> sorted distinct integers >= 1."""
    ks: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        try:
            ks.update(range(int(lo), int(hi) + 1) if dash else [int(part)])
        except ValueError:
            raise BadOption(f"--k {text!r} is not a list of integers: write e.g. --k 1,2,4 or 1-8") from None
    if not ks or min(ks) < 1:
        raise BadOption(f"--k {text!r} is out of range: give integers >= 1, e.g. --k 1,2,4,6,8")
    return sorted(ks)


def default_prompts() -> list[dict]:
    """The prompt set shipped with the package: a dozen code and prose prompts, alternating."""
    return json.loads(resources.files("specmac").joinpath("data", "prompts.json").read_text("utf-8"))


def read_prompts(path: str | None, limit: int | None = None) -> list[dict]:
    """Prompts from a .json file (a list of strings or of {"id", "text"} objects) or a text file
    (prompts separated by lines holding only ``---``); None gives the default set."""
    if path is None:
        prompts = default_prompts()
    else:
        try:
            text = Path(path).read_text("utf-8")
        except OSError as e:
            raise BadOption(f"cannot read --prompts {path}: {e.strerror}") from None
        prompts = _parse_prompts(text, json_file=path.endswith(".json"), source=path)
    if limit is not None:
        if limit < 1:
            raise BadOption(f"--n-prompts {limit} is out of range: use an integer >= 1")
        prompts = prompts[:limit]
    return prompts


def _parse_prompts(text: str, *, json_file: bool, source: str) -> list[dict]:
    if json_file:
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadOption(f"--prompts {source} is not valid JSON ({e.msg}, line {e.lineno})") from None
    else:
        blocks = "\n".join("\x00" if line.strip() == "---" else line for line in text.splitlines())
        items = [b.strip("\n") for b in blocks.split("\x00")]
    out = []
    for i, item in enumerate(items if isinstance(items, list) else [None]):
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise BadOption(f"--prompts {source}: entry {i} is not a string or an object with 'text'")
        if item["text"].strip():
            out.append({"id": str(item.get("id", f"p{i}")), "kind": item.get("kind", ""),
                        "text": item["text"]})
    if not out:
        raise BadOption(f"--prompts {source} holds no prompt: give at least one non-empty prompt")
    return out


# --- backend models and options -----------------------------------------------------------------

def backend_settings(config: dict | None = None, *, draft_model: dict[str, str] | None = None,
                     target_model: dict[str, str] | None = None,
                     opts: Iterable[tuple[str, str, Any]] = (),
                     draft_opts: Iterable[tuple[str, str, Any]] = (),
                     target_opts: Iterable[tuple[str, str, Any]] = ()) -> dict[str, dict]:
    """Merge a TOML config ({backend: {draft_model, target_model, options, draft_options,
    target_options}}) with command-line values, which win. opts are (backend, key, value)."""
    out: dict[str, dict] = {}
    for name, table in (config or {}).items():
        if not isinstance(table, dict) or set(table) - set(BACKEND_KEYS):
            raise BadOption(f"config table [{name}] may only hold {', '.join(BACKEND_KEYS)}")
        out[name] = {k: (dict(v) if k.endswith("options") else str(v)) for k, v in table.items()}
    for key, given in (("draft_model", draft_model), ("target_model", target_model)):
        for name, path in (given or {}).items():
            out.setdefault(name, {})[key] = path
    for key, triples in (("options", opts), ("draft_options", draft_opts), ("target_options", target_opts)):
        for name, k, v in triples:
            out.setdefault(name, {}).setdefault(key, {})[k] = v
    return out


def read_config(path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise BadOption("--config needs Python >= 3.11 or the tomli package: pip install tomli") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise BadOption(f"cannot read --config {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise BadOption(f"--config {path} is not valid TOML: {e}") from None


def model_and_options(backends: dict[str, dict], name: str, role: str) -> tuple[str | None, dict]:
    """The model path and options of backend ``name`` loaded as ``role`` (role options win)."""
    s = backends.get(name, {})
    return s.get(f"{role}_model"), {**s.get("options", {}), **s.get(f"{role}_options", {})}


@dataclass
class Loaded:
    targets: dict[str, BaseBackend]
    drafters: dict[str, Drafter]

    def pair(self, c: Config) -> Pair:
        return Pair(self.targets[c.target], Drafter() if c.baseline else self.drafters[c.draft])

    def backends(self) -> dict[str, dict]:
        """"target:gguf" / "draft:mlx" -> backend info (model, library, resolved options)."""
        out = {f"target:{n}": b.info() for n, b in self.targets.items()}
        out.update({f"draft:{n}": d.info() for n, d in self.drafters.items()})
        return out


def load_models(settings: Settings) -> Loaded:
    """Load each target backend and each draft backend once; check every pairing's vocabularies."""
    be = settings.backends
    unused = set(be) - {p.target for p in settings.pairs} - {p.draft for p in settings.pairs}
    if unused:
        raise BadOption(f"models or options given for {', '.join(sorted(unused))}, which no --pair uses")
    targets = {t: load_backend(t, *model_and_options(be, t, "target"), role="target")
               for t in dict.fromkeys(p.target for p in settings.pairs)}
    drafters: dict[str, Drafter] = {}
    for d in dict.fromkeys(p.draft for p in settings.pairs):
        if d in MODEL_FREE:
            if d in be:
                raise BadOption(f"the {d} drafter takes no model or options: drop them")
            drafters[d] = NgramDrafter()
        else:
            drafters[d] = ModelDrafter(load_backend(d, *model_and_options(be, d, "draft"), role="draft"))
    for p in settings.pairs:
        if isinstance(drafters[p.draft], ModelDrafter):
            check_compatible(drafters[p.draft].backend.vocab, targets[p.target].vocab)
    return Loaded(targets, drafters)


# --- measuring ----------------------------------------------------------------------------------

def measure(settings: Settings, loaded: Loaded,
            progress: Callable[[str], None] | None = None) -> tuple[list[dict], bool]:
    """Warm up every configuration, then run rounds (repeat x prompt) over all of them.
    Returns (runs, interrupted): Ctrl-C stops early and keeps the complete rounds."""
    configs = settings.configs()
    pairs = {c.id: loaded.pair(c) for c in configs}
    ids = {t: [b.encode(p["text"]) for p in settings.prompts] for t, b in loaded.targets.items()}
    tick = progress or (lambda _desc: None)
    for c in configs:  # warm-up: kernels, allocations, lazy compilation; not recorded
        pairs[c.id].generate(ids[c.target][0], params=settings.params, k=max(c.k, 1), seed=settings.seed,
                             max_tokens=min(settings.warmup_tokens, settings.max_tokens))
        tick(f"warm-up {c.id}")
    runs: list[dict] = []
    try:
        for r in range(settings.repeats):
            for i, prompt in enumerate(settings.prompts):
                seed = settings.seed + 1000 * r + i  # the same seed for every configuration
                rnd = []
                for c in configs:
                    g = pairs[c.id].generate(ids[c.target][i], params=settings.params, k=max(c.k, 1),
                                             max_tokens=settings.max_tokens, seed=seed)
                    rnd.append(run_record(c, prompt["id"], r, seed, g.stats, g.token_ids))
                    tick(f"{c.id} {prompt['id']} r{r + 1}")
                runs += rnd
    except KeyboardInterrupt:
        return runs, True
    return runs, False


def run_record(c: Config, prompt: str, repeat: int, seed: int, s: RunStats, token_ids: list[int]) -> dict:
    """One generation, with the raw counts that aggregates are recomputed from."""
    return {"config": c.id, "draft": c.draft, "target": c.target, "k": c.k, "prompt": prompt,
            "round": repeat, "seed": seed, "n_tokens": s.n_tokens, "n_target_passes": s.n_target_passes,
            "n_drafted": s.n_drafted, "n_accepted": s.n_accepted, "reached": list(s.reached),
            "accepted_at": list(s.accepted_at), "t_draft": s.t_draft, "t_verify": s.t_verify,
            "t_other": s.t_other, "seconds": s.seconds, "tokens_per_second": s.tokens_per_second,
            "finish_reason": s.finish_reason,
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
    base = {(r["target"], r["prompt"], r["round"]): r for r in runs if r["draft"] == BASELINE}
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
    spec = first["draft"] != BASELINE
    out = {"config": first["config"], "draft": first["draft"], "target": first["target"], "k": first["k"],
           "n_runs": len(rs), "n_tokens": tokens, "seconds": seconds,
           "tokens_per_second": spread([r["tokens_per_second"] for r in rs]),
           "speedup": spread(ratios),
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


def _per_position(rs: list[dict]) -> list[float | None]:
    n = max((len(r["reached"]) for r in rs), default=0)
    reached, acc = np.zeros(n), np.zeros(n)
    for r in rs:
        reached[: len(r["reached"])] += r["reached"]
        acc[: len(r["accepted_at"])] += r["accepted_at"]
    return [float(a / m) if m else None for a, m in zip(acc, reached)]


# --- the cost model's prediction ----------------------------------------------------------------

ADVISE_PROMPTS = 4  # advise measures acceptance on the first prompts of the run's own set


def predict(settings: Settings, loaded: Loaded) -> dict[str, dict]:
    """advise() for every pairing, made before the measurement: pairing id -> its answer (or
    {"error": ...} when the cost model cannot say, e.g. a probe that fails on this backend).
    Acceptance comes from the first ADVISE_PROMPTS prompts of the run's set."""
    from specmac.costmodel import advise

    out = {}
    for p in settings.pairs:
        pair = loaded.pair(Config(p.draft, p.target, 1))
        try:
            out[p.id] = advise(pair, params=settings.params, k_max=max(settings.ks), seed=settings.seed,
                               prompts=[q["text"] for q in settings.prompts[:ADVISE_PROMPTS]])
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
                status: Callable[[str], None] | None = None) -> dict:
    """Load, predict, measure, aggregate: the record that ``results.json`` holds. ``progress`` is
    called after each generation (``Settings.n_runs`` in all), ``status`` at each phase."""
    from specmac.results import provenance

    if not settings.pairs:
        raise BadOption("no pairing to compare: give at least one --pair DRAFT:TARGET")
    say = status or (lambda _desc: None)
    say("loading models")
    loaded = load_models(settings)
    backends = loaded.backends()
    # hash the model files now: they are what was loaded, even if a file changes during the run
    prov = provenance(command, models=list(dict.fromkeys(model_path(i) for i in backends.values()
                                                         if i.get("model"))))
    prov["backend_options"] = {role: i.get("options", {}) for role, i in backends.items()}
    say("cost model (advise)")
    predictions = predict(settings, loaded)
    runs, interrupted = measure(settings, loaded, progress)
    if not runs:
        raise SpecmacError("interrupted before the first round was complete: nothing to report")
    results = aggregate(runs, settings.params.greedy)
    attach_predictions(results, predictions)
    return {"format": FORMAT, "provenance": prov,
            "settings": settings.to_dict(), "backends": backends, "interrupted": interrupted,
            "predictions": predictions, "results": results, "runs": runs}


def model_path(info: dict) -> str:
    """The file or folder a backend loaded: a resolved "path" option (e.g. the embedded GGUF,
    whose model id is a name) wins over the model id, so provenance can hash it."""
    path = (info.get("options") or {}).get("path")
    return str(path) if path and Path(path).exists() else str(info["model"])


def load_record(directory: str | Path) -> dict:
    """results.json of a compare run, checked enough to render."""
    path = Path(directory) / "results.json"
    try:
        record = json.loads(path.read_text("utf-8"))
    except OSError:
        raise BadOption(f"no results.json in {directory}: give the --out folder of a compare run") from None
    except json.JSONDecodeError as e:
        raise BadOption(f"{path} is not valid JSON ({e.msg}): re-run specmac compare") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise BadOption(f"{path} is not a specmac compare record (format {FORMAT}): re-run specmac compare")
    return record


# --- rendering: summary.md and plots, from the record alone -------------------------------------

PLOTS = {"speedup_vs_k.png": "speedup over target-only vs K, per pairing",
         "acceptance_vs_k.png": "acceptance rate vs K, per pairing",
         "measured_vs_predicted.png": "measured vs predicted speedup (cost model)"}


def render(record: dict, directory: str | Path) -> list[Path]:
    """Write summary.md and the PNG plots of ``record`` into ``directory``; return their paths."""
    from specmac.results import save_figure

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.md").write_text(summary_markdown(record), "utf-8")
    return [d / "summary.md"] + [save_figure(fig, d / name) for name, fig in figures(record).items()]


def label(row: dict) -> str:
    return f"{row['target']} only" if row["draft"] == BASELINE else f"{row['draft']} \u2192 {row['target']}"


def fmt(v: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "\u2013" if v is None else f"{v:{spec}}{unit}"


def med(stat: dict | None, key: str = "median") -> float | None:
    return stat[key] if stat else None


def best_rows(record: dict) -> list[dict]:
    """Per pairing, the measured configuration with the highest median speedup."""
    best: dict[str, dict] = {}
    for row in record["results"]:
        pid = f"{row['draft']}:{row['target']}"
        if row["draft"] != BASELINE and (pid not in best or
                                         (med(row["speedup"]) or 0) > (med(best[pid]["speedup"]) or 0)):
            best[pid] = row
    return sorted(best.values(), key=lambda r: -(med(r["speedup"]) or 0))


def headline(record: dict) -> str:
    """The one-sentence answer: which pairing and K to run, or that none pays here."""
    rows = best_rows(record)
    if not rows:
        return "Nothing was measured."
    top = rows[0]
    pred = fmt(top.get("predicted_speedup"), ".2f", "\u00d7")
    tail = (f"{fmt(med(top['speedup']), '.2f', '×')} the speed of target-only {top['target']} "
            f"({fmt(med(top['tokens_per_second']), '.1f')} tokens/s; the cost model predicted {pred})")
    if (med(top["speedup"]) or 0) > 1:
        return f"**Run {label(top)} at K={top['k']}:** {tail}."
    return (f"**No pairing beats target-only decoding on this machine.** The best, {label(top)} at "
            f"K={top['k']}, runs at {tail}.")


def summary_markdown(record: dict) -> str:
    prov, st = record["provenance"], record["settings"]
    machine = prov.get("machine", {})
    lines = ["# specmac compare", "", headline(record), ""]
    if record.get("interrupted"):
        lines += ["> Interrupted: only the complete rounds measured before Ctrl-C are included.", ""]
    lines += ["## Best K per pairing", "",
              "| pairing | best K | tokens/s | speedup | acceptance | predicted best K | predicted speedup |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in best_rows(record):
        adv = record["predictions"].get(f"{r['draft']}:{r['target']}", {})
        lines.append(f"| {label(r)} | {r['k']} | {fmt(med(r['tokens_per_second']), '.1f')} | "
                     f"{fmt(med(r['speedup']), '.2f', '×')} | {fmt(r['acceptance_rate'], '.3f')} | "
                     f"{adv.get('best_k', '–')} | {fmt(adv.get('predicted_speedup'), '.2f', '×')} |")
    lines += ["", "## Every configuration", ""]
    for target in dict.fromkeys(r["target"] for r in record["results"]):
        lines += _target_table(record, target)
    lines += _method(record, st, prov, machine)
    lines += ["## Plots", ""] + [f"![{title}]({name})" for name, title in PLOTS.items()] + [""]
    return "\n".join(lines)


def _target_table(record: dict, target: str) -> list[str]:
    rows = [r for r in record["results"] if r["target"] == target]
    out = [f"### Target {target}", "",
           "| pairing | K | tokens/s median | tokens/s IQR | speedup median | speedup IQR | predicted "
           "speedup | acceptance | tokens/pass | predicted tokens/pass | per-position acceptance | "
           "time draft/verify/other | greedy match |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        tps, sp, ts = r["tokens_per_second"], r["speedup"], r["time_split"]
        per = " ".join(fmt(a, ".2f") for a in r["per_position_acceptance"] or [])
        split = "/".join(fmt(None if ts[p] is None else 100 * ts[p], ".0f")
                         for p in ("draft", "verify", "other"))
        out.append(
            f"| {label(r)} | {r['k'] or '–'} | {fmt(med(tps), '.1f')} | "
            f"{fmt(med(tps, 'p25'), '.1f')}–{fmt(med(tps, 'p75'), '.1f')} | {fmt(med(sp), '.2f', '×')} | "
            f"{fmt(med(sp, 'p25'), '.2f')}–{fmt(med(sp, 'p75'), '.2f')} | "
            f"{fmt(r.get('predicted_speedup'), '.2f', '×')} | {fmt(r['acceptance_rate'], '.3f')} | "
            f"{fmt(r['tokens_per_target_pass'], '.2f')} | {fmt(r.get('predicted_tokens_per_pass'), '.2f')} | "
            f"{per or '–'} | {split} % | {fmt(r['greedy_match'], '.0%')} |")
    return out + [""]


def _method(record: dict, st: dict, prov: dict, machine: dict) -> list[str]:
    errors = {p: a["error"] for p, a in record["predictions"].items() if "error" in a}
    s = st["sampling"]
    out = ["## How this was measured", "",
           f"- Command: `{prov.get('command')}`",
           f"- Git {prov.get('git_sha')}, {prov.get('utc')}, specmac {prov.get('specmac')}, "
           f"Python {prov.get('python')}; libraries: "
           + ", ".join(f"{k} {v}" for k, v in prov.get("libraries", {}).items() if v),
           f"- Machine: {machine.get('processor') or machine.get('machine')}, "
           f"{machine.get('cpu_count')} CPUs, {machine.get('platform')}",
           f"- {len(st['prompts'])} prompts ({', '.join(st['prompts'])}) \u00d7 {st['repeats']} repeats, "
           f"{st['max_tokens']} new tokens each, temperature {s['temperature']}"
           + (f", top-k {s['top_k']}" if s["top_k"] else "")
           + (f", top-p {s['top_p']}" if s["top_p"] < 1 else "")
           + (f", min-p {s['min_p']}" if s["min_p"] else "") + f", seed {st['seed']}.",
           "- Rounds are interleaved: each (prompt, repeat) runs every configuration once, in the order "
           "of the tables; one warm-up round of "
           f"{st['warmup_tokens']} tokens per configuration is discarded. Each target backend is loaded "
           "once and reset before every run, so no cache carries over.",
           "- tokens/s counts the decoding steps (draft, verify, bookkeeping; the draft's prefill of the "
           "prompt included, the target's excluded). Speedup is the median over runs of tokens/s divided "
           "by the target-only run of the same target, prompt and round; IQR = 25th–75th percentile.",
           "- Acceptance and tokens per target pass are pooled over all runs; per-position acceptance is "
           "conditional (of the steps that reached draft position i, the fraction accepted). Greedy "
           "match: share of runs whose output equals the target-only output (temperature 0 only).",
           "- Predicted: `specmac.costmodel.advise` for each pairing, run before the measurement "
           f"(acceptance from the first {ADVISE_PROMPTS} prompts)."]
    out += [f"- No prediction for {p}: {e}" for p, e in errors.items()]
    out.append("- Backends: " + "; ".join(
        f"{role} {i.get('backend', i.get('drafter'))} ({i.get('model') or i.get('drafter')}, "
        f"{json.dumps(i.get('options', {}), sort_keys=True)})" for role, i in record["backends"].items()))
    return out + [""]


def _colors(record: dict) -> dict[str, str]:
    drafts = dict.fromkeys(r["draft"] for r in record["results"] if r["draft"] != BASELINE)
    return {d: f"C{i % 10}" for i, d in enumerate(drafts)}


def _series(record: dict, target: str) -> dict[str, list[dict]]:
    """draft -> its rows with this target, by K."""
    out: dict[str, list[dict]] = {}
    for r in sorted(record["results"], key=lambda r: r["k"]):
        if r["target"] == target and r["draft"] != BASELINE:
            out.setdefault(r["draft"], []).append(r)
    return out


def _panels(record: dict, height: float = 4.4):
    from matplotlib.figure import Figure

    targets = list(dict.fromkeys(r["target"] for r in record["results"]))
    fig = Figure(figsize=(4.4 * len(targets) + 0.6, height))
    axes = fig.subplots(1, len(targets), squeeze=False, sharey=True)[0]
    return fig, dict(zip(targets, axes))


def _legend_below(ax) -> None:
    """Below the panel, where it cannot hide a curve (lines span the whole K range)."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def figures(record: dict) -> dict:
    """The plots as matplotlib Figures (name -> Figure), built from the record's numbers only."""
    return {"speedup_vs_k.png": fig_speedup(record), "acceptance_vs_k.png": fig_acceptance(record),
            "measured_vs_predicted.png": fig_predicted(record)}


def _style_k_panel(ax, record: dict, target: str) -> None:
    """What every per-target panel against K shares: title, K axis, grid, legend."""
    ax.set_title(f"target: {target}", fontsize=10)
    ax.set_xlabel("K (draft tokens per step)")
    ax.set_xticks(record["settings"]["k"])
    ax.grid(alpha=0.3)
    _legend_below(ax)


def fig_speedup(record: dict):
    fig, panels = _panels(record)
    colors = _colors(record)
    for target, ax in panels.items():
        base = next((r for r in record["results"] if r["target"] == target and r["draft"] == BASELINE), None)
        for draft, rows in _series(record, target).items():
            rows = [r for r in rows if r["speedup"]]  # None when no run produced a token
            ks = [r["k"] for r in rows]
            m = [med(r["speedup"]) for r in rows]
            lo = [med(r["speedup"]) - med(r["speedup"], "p25") for r in rows]
            hi = [med(r["speedup"], "p75") - med(r["speedup"]) for r in rows]
            ax.errorbar(ks, m, yerr=[lo, hi], marker="o", ms=4, capsize=3, color=colors[draft],
                        label=f"{draft} \u2192 {target}")
        base_tps = fmt(med(base["tokens_per_second"]) if base else None, ".0f")
        ax.axhline(1.0, color="k", ls="--", lw=1, label=f"{target} only = 1.0 ({base_tps} tok/s)")
        _style_k_panel(ax, record, target)
    next(iter(panels.values())).set_ylabel("speedup over target-only (median, IQR bars)")
    fig.suptitle("Speedup vs K", fontsize=11)
    return fig


def fig_acceptance(record: dict):
    fig, panels = _panels(record)
    colors = _colors(record)
    for target, ax in panels.items():
        for draft, rows in _series(record, target).items():
            pts = [(r["k"], r["acceptance_rate"]) for r in rows if r["acceptance_rate"] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=4, color=colors[draft], label=f"{draft} \u2192 {target}")
        ax.set_ylim(0, 1.05)
        _style_k_panel(ax, record, target)
    next(iter(panels.values())).set_ylabel("acceptance rate (accepted / drafted)")
    fig.suptitle("Acceptance vs K", fontsize=11)
    return fig


def fig_predicted(record: dict):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.2, 5.4))
    ax = fig.subplots()
    colors, markers = _colors(record), "osD^v<>p*h"
    targets = list(dict.fromkeys(r["target"] for r in record["results"]))
    pts_all = []
    for target in targets:
        for draft, rows in _series(record, target).items():
            pts = [(r["predicted_speedup"], med(r["speedup"]), r["k"]) for r in rows
                   if r.get("predicted_speedup") is not None and r["speedup"]]
            if not pts:
                continue
            x, y, ks = zip(*pts)
            ax.scatter(x, y, color=colors[draft], marker=markers[targets.index(target) % len(markers)],
                       s=28, label=f"{draft} \u2192 {target}")
            for xi, yi, k in pts:
                ax.annotate(str(k), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=6)
            pts_all += pts
    lim = max([1.2] + [max(p[0], p[1]) * 1.1 for p in pts_all])
    ax.plot([0, lim], [0, lim], color="gray", lw=1, label="measured = predicted")
    ax.axhline(1.0, color="k", ls="--", lw=1, label="target-only baseline (1.0)")
    ax.axvline(1.0, color="k", ls=":", lw=0.8)
    ax.set_xlim(0, lim)
    ax.set_ylim(0, lim)
    ax.set_xlabel("predicted speedup (cost model)")
    ax.set_ylabel("measured speedup (median)")
    ax.set_title("Measured vs predicted speedup (numbers: K)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside: points fill the square
    return fig
