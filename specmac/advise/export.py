"""advise's choice in another engine: the launch command of llama-server, vLLM, SGLang or
mlx_lm.server that realises one configuration, and one line of what that engine cannot express.

A configuration is a profile's (``specmac.advise.profile``): target and draft (backend, model,
options, precision, the draft's kind: none, lookup, model or hybrid), K and the sampler. What an
engine runs differs from specmac in known ways, each answered with the nearest fixed setting the
engine has: it runs one weight format for both models (llama-server GGUF files, vLLM and SGLang
Hugging Face folders, mlx_lm.server MLX or Hugging Face folders), so a draft on another backend than
its target and a target in another format become the same weights in the engine's format; the
hybrid becomes llama-server's documented mix of an n-gram type and a draft model, elsewhere the
better-ranked of its model alone and its lookup alone; ``--k auto`` becomes a fixed K; specmac's
lookup becomes the engine's n-gram matcher at the lookup's match lengths. Every option used is in
``specmac.advise.engines``, checked against each engine's documentation.
"""

from __future__ import annotations

import json
from pathlib import Path

from specmac import assets
from specmac.advise.engines import ENGINES
from specmac.backends.conversion import cache
from specmac.core.drafters import NgramDrafter
from specmac.core.lookup import LookupDrafter
from specmac.errors import BadOption

DEFAULT_K = 3  # llama-server's and mlx_lm.server's documented default draft length
_FORMAT = {"llama-server": "gguf", "vllm": "hf", "sglang": "hf", "mlx-lm": "hf"}
_FORMAT_NAME = {"gguf": "GGUF files", "hf": "Hugging Face folders"}
_GGUF_DTYPE = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_NAME = {"llama-server": "llama-server", "vllm": "vLLM", "sglang": "SGLang", "mlx-lm": "mlx_lm.server"}


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise BadOption(f"export {engine!r} is not an engine specmac writes for: choose one of "
                        f"{', '.join(ENGINES)}", param="export")
    return engine


def _lengths(free: str) -> tuple[int, int]:
    """(shortest, longest) match a model-free drafter proposes from, as its class sets them."""
    if free == "lookup":
        d = LookupDrafter()
        return d.min_match, d.max_match
    n = NgramDrafter()
    return n.min_ngram, n.max_ngram


def _converted(source: Path, variants: list[str], name: str) -> Path | None:
    """The conversion of ``source`` specmac made and keeps in its cache, if any."""
    for v in variants:
        try:
            hit = cache.lookup(source, v)
        except OSError:  # an unreadable cache or source: as if there were none
            return None
        if hit is not None:
            return hit[0] / name if name else hit[0]
    return None


_TODO = {"hf": "make a Hugging Face folder of {} first (`specmac models convert FILE.gguf --out "
               "FOLDER`; torch and mlx also make one, cached, when they load a GGUF file; `specmac models` "
               "lists them)",
         "gguf": "make a GGUF of {} first (specmac makes an F16 one, cached, when the gguf backend loads a "
                 "folder; `specmac models` lists them)",
         "quant": "requantise {} first (specmac makes it, cached, when the gguf backend loads it)",
         "none": "{} have no file an engine can load"}


def _weights(side: dict, role: str, fmt: str) -> tuple[str, tuple[str, str] | None]:
    """(what to hand the engine for this model in format ``fmt``, (what to do first, to what) where
    specmac holds no such file). The embedded pair ships in both formats; a conversion specmac made
    is found in its cache."""
    backend, model, opts = side["backend"], side.get("model"), side.get("options") or {}
    if model is None:
        if backend not in ("gguf", "torch", "mlx"):
            return f"<the {backend} backend's default {role}>", ("none", f"the {backend} backend's models")
        if fmt == "gguf":  # a torch or mlx side is nearest the unquantised F16
            quant = opts.get("quant") or ("q8_0" if backend == "gguf" else "f16")
            return str(assets.gguf_file(role, quant)), None
        return str(assets.hf_dir(role)), None
    path = Path(model)
    is_gguf = path.suffix == ".gguf"
    if fmt == "gguf" and is_gguf:
        quant = opts.get("quant") if backend == "gguf" else None
        if not quant:
            return model, None
        hit = _converted(path, [f"gguf-{quant}"], "model.gguf")
        return (str(hit), None) if hit else (model, ("quant", f"{path.name} to {quant.upper()}"))
    if fmt == "hf" and not is_gguf:
        return model, None
    if fmt == "hf":
        dtypes = [opts.get("dtype") or "float32", "float32", "bfloat16", "float16"]
        hit = _converted(path, [f"hf-{d}" for d in dict.fromkeys(dtypes)], "")
        return (str(hit), None) if hit else (f"<{path.name} as a Hugging Face folder>", ("hf", path.name))
    hit = _converted(path, ["gguf-f16"], "model.gguf")
    return (str(hit), None) if hit else (f"<{path.name} as GGUF>", ("gguf", path.name))


def _todo_notes(todos: list[tuple[str, str] | None]) -> list[str]:
    """One note per kind of file to make first, naming every model it applies to."""
    by_kind: dict[str, list[str]] = {}
    for t in filter(None, todos):
        by_kind.setdefault(t[0], []).append(t[1])
    return [_TODO[kind].format(" and ".join(dict.fromkeys(names))) for kind, names in by_kind.items()]


def _dtype(target: dict) -> str | None:
    """The --dtype of vLLM and SGLang nearest the target's precision (None: leave it auto)."""
    p = str(target.get("precision") or "")
    return p if p in ("float32", "float16", "bfloat16") else _GGUF_DTYPE.get(p.upper())


def _stored_dtype(folder: str) -> str | None:
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("torch_dtype") or cfg.get("dtype")


def _precision_note(target: dict, engine: str, folder: str) -> str | None:
    """What changes in the output distribution: the engine runs other weights than specmac's target."""
    backend, precision = target["backend"], target.get("precision") or ""
    if engine == "llama-server":
        return None if backend == "gguf" else (f"llama-server runs GGUF files, not the {backend} {precision} "
                                                "target: its output is the GGUF weights' distribution")
    if backend == "gguf":
        dtype = _dtype(target)
        if dtype is None:  # a quantised GGUF: llama.cpp's quantised kernels are in no folder
            return (f"{_NAME[engine]} runs {_FORMAT_NAME['hf']}, not the GGUF {precision} target: nearest "
                    "is its weights dequantised into a folder, another output distribution")
        how = f"at --dtype {dtype}" if engine != "mlx-lm" else "in the folder's stored precision"
        return f"{_NAME[engine]} runs {_FORMAT_NAME['hf']}, not GGUF files: nearest is the same weights {how}"
    if engine == "mlx-lm" and precision not in (_stored_dtype(folder), "native", ""):
        return f"mlx_lm.server runs the folder in its stored precision, not {precision}"
    return None


def _nearest(config: dict, ranked: list[dict], free: str, engine: str) -> tuple[dict, str]:
    """The hybrid's nearest fixed setting: the better-ranked of its model alone and its lookup alone
    (mlx-lm has no lookup: the model alone), with the line that says so."""
    d = config["draft"]
    model_backend = d["backend"].split("+", 1)[1]

    def alone(c: dict) -> str | None:
        cd = c["draft"]
        if cd.get("kind") == "lookup" and cd["backend"] == free and engine != "mlx-lm":
            return "lookup"
        same = (cd["backend"], cd.get("model"), cd.get("precision")) == (model_backend, d.get("model"),
                                                                         d.get("precision"))
        return "model" if cd.get("kind") == "model" and same else None

    for c in ranked:
        if c["target"] == config["target"] and alone(c) and c.get("k"):
            what = alone(c)
            name = free if what == "lookup" else f"its {model_backend} model"
            return c, (f"the hybrid {d['backend']} (per step the lookup's draft or the model's, by predicted "
                       f"tokens/s) has no equivalent: nearest is {name} alone at K = {c['k']}"
                       + (f", ranked {c['rank']} here" if c.get("rank") else ""))
    k = config["k"] if isinstance(config["k"], int) else DEFAULT_K
    plain = {**d, "backend": model_backend, "kind": "model"}
    return ({**config, "draft": plain, "k": k},
            f"the hybrid {d['backend']} has no equivalent: nearest is its {model_backend} model alone")


def export_config(config: dict, engine: str, *, ranked: list[dict] | None = None,
                  temperature: float = 0.0) -> dict:
    """{"engine", "command" (argv), "cannot" (one line, or None), "checked" (the docs read)} for
    ``config`` in ``engine``. ``ranked``: the configurations of its precision group in advise's order
    (the hybrid's nearest setting and ``--k auto``'s nearest K come from it)."""
    check_engine(engine)
    ranked = list(ranked or [])
    notes: list[str] = []
    draft = config["draft"]
    kind = draft.get("kind", "none")
    k = config["k"]
    if k == "auto":
        same = [c["k"] for c in ranked if c["draft"] == draft and c["target"] == config["target"]
                and isinstance(c["k"], int) and c["k"] > 0]
        k = same[0] if same else DEFAULT_K
        why = "advise's K for this pairing" if same else "the engines' default"
        notes.append(f"--k auto (K chosen every step from measured costs) has no equivalent: nearest is a "
                     f"fixed K = {k} ({why})")
    if config.get("sampler") == "coupled":
        notes.append("the coupled sampler (seed-exact Gumbel noise) has no equivalent: the engine's own "
                     "rejection sampling keeps the same output distribution, not the same text per seed")
    mix = False
    if kind == "hybrid":
        free = draft["backend"].split("+", 1)[0]
        if engine == "llama-server":
            mix = True
            notes.append("llama-server takes the n-gram draft wherever it finds one and the model's "
                         f"elsewhere; specmac's hybrid {draft['backend']} picks per step by predicted "
                         "tokens/s")
        else:
            near, line = _nearest({**config, "k": k}, ranked, free, engine)
            notes.append(line)
            draft, k = near["draft"], near["k"]
            kind = draft.get("kind", "model")
    fmt = _FORMAT[engine]
    target_path, todo = _weights(config["target"], "target", fmt)
    todos = [todo]
    if note := _precision_note(config["target"], engine, target_path):
        notes.append(note)
    model = free_drafter = None
    if k and kind in ("model", "hybrid"):
        side = {**draft, "backend": draft["backend"].split("+")[-1]}
        model, todo = _weights(side, "draft", fmt)
        todos.append(todo)
        if side["backend"] != config["target"]["backend"]:
            notes.append(f"the draft ran on {side['backend']} and the target on "
                         f"{config['target']['backend']}: {_NAME[engine]} runs both as {_FORMAT_NAME[fmt]}")
    notes += _todo_notes(todos)
    if k and (kind == "lookup" or mix):
        free_drafter = draft["backend"].split("+")[0]
    build = {"llama-server": _llama_server, "vllm": _vllm, "sglang": _sglang, "mlx-lm": _mlx_lm}[engine]
    command = build(target_path, config["target"], model, free_drafter, k, temperature, notes)
    return {"engine": engine, "command": command, "cannot": "; ".join(notes) or None,
            "checked": list(ENGINES[engine].checked)}


def _lookup_note(free: str, engine: str, how: str) -> str:
    lo, hi = _lengths(free)
    what = (f"specmac's ngram matches {hi} down to {lo} tokens" if free == "ngram" else
            "specmac's lookup drafts as far as earlier continuations agree and weighs short matches by "
            "their running acceptance")
    return f"{what}; {engine} {how}"


def _llama_server(target, tside, model, free, k, temperature, notes) -> list[str]:
    cmd = ["llama-server", "-m", target]
    types = (["ngram-simple"] if free else []) + (["draft-simple"] if model else [])
    if types:
        cmd += ["--spec-type", ",".join(types)]
    if free:
        lo, hi = _lengths(free)
        n = hi if free == "ngram" else lo  # ngram tries its longest first; lookup trusts from min_match on
        cmd += ["--spec-ngram-simple-size-n", str(n), "--spec-ngram-simple-size-m", str(k)]
        notes.append(_lookup_note(free, "llama-server", f"matches exactly {n} tokens (ngram-simple)"))
    if model:
        # p-min 0: every one of the K tokens is drafted, as specmac does
        cmd += ["--model-draft", model, "--spec-draft-n-max", str(k), "--draft-p-min", "0"]
        if temperature > 0:  # the draft sampled and verified by rejection, as specmac's rule
            cmd += ["--spec-draft-sampling", "probabilistic"]
    return cmd


def _vllm(target, tside, model, free, k, temperature, notes) -> list[str]:
    cmd = ["vllm", "serve", target]
    if dtype := _dtype(tside):
        cmd += ["--dtype", dtype]
    spec: dict = {}
    if model:
        spec = {"model": model, "method": "draft_model", "num_speculative_tokens": k}
        if temperature > 0:
            spec["draft_sample_method"] = "probabilistic"
    elif free:
        lo, hi = _lengths(free)
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": hi,
                "prompt_lookup_min": lo}
        if free == "lookup":
            notes.append(_lookup_note(free, "vLLM", f"proposes K tokens after any match of {lo} to {hi}"))
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def _sglang(target, tside, model, free, k, temperature, notes) -> list[str]:
    cmd = ["python", "-m", "sglang.launch_server", "--model-path", target]
    if dtype := _dtype(tside):
        cmd += ["--dtype", dtype]
    if model:
        # one chain of K drafts: top-k 1, and K + 1 tokens verified (the step's last token included)
        cmd += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", model,
                "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]
    elif free:
        cmd += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k + 1),
                "--speculative-ngram-max-bfs-breadth", "1"]
        notes.append(_lookup_note(free, "SGLang", "matches the longest suffix its n-gram cache holds (the "
                                                  "window options differ across SGLang releases: left at "
                                                  "their defaults)"))
    return cmd


def _mlx_lm(target, tside, model, free, k, temperature, notes) -> list[str]:
    cmd = ["mlx_lm.server", "--model", target]
    if model:
        cmd += ["--draft-model", model, "--num-draft-tokens", str(k)]
    elif free:
        notes.append(f"mlx_lm.server has no n-gram or prompt-lookup drafter: nearest is plain decoding "
                     f"(specmac's {free} at K = {k})")
    return cmd


def _what(config: dict) -> str:
    t, d, k = config["target"], config["draft"], config["k"]
    target = f"{t['backend']} {t.get('precision') or ''}".strip()
    if not k or d.get("kind") == "none":
        return f"plain {target}"
    src = d["backend"] if d.get("kind") == "lookup" else f"{d['backend']} {d.get('precision') or ''}".strip()
    return f"{src} \u2192 {target}, K = {k}"


def export_choice(record: dict, engine: str) -> dict:
    """The export of advise's first choice: the first configuration of the group a profile of this
    ranking serves by default (``specmac.advise.profile.choose``), with the group and what it is."""
    from specmac.advise.profile import build_profile, choose

    prof = build_profile(record)
    group, config, _ = choose(prof, "this ranking")
    temperature = float((record.get("sampling") or {}).get("temperature") or 0.0)
    out = export_config(config, engine, ranked=group["configurations"], temperature=temperature)
    return {**out, "group": group["group"], "configuration": _what(config)}


def export_lines(exp: dict) -> list[str]:
    """The export as text: what it realises, the command (shell-quoted), and the line of what the
    engine cannot express."""
    import shlex

    lines = [f"{exp['engine']}: {exp['configuration']} (first choice of {exp['group']}); options as "
             f"documented in {exp['checked'][0].split(' (')[0]}", "  " + shlex.join(exp["command"])]
    if exp["cannot"]:
        lines.append(f"cannot express: {exp['cannot']}")
    return lines
