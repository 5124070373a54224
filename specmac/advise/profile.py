"""A profile: advise's ranking kept in a file, so that `specmac serve --profile FILE` (and `run`)
load the configuration advise chose without the user retyping it.

``build_profile`` turns ``rank_configurations``' record into the profile: per precision group (one
output distribution) the ranked configurations in order, each complete enough to load (backend
names, absolute model paths, backend options, K, the draft kind) with its predictions.
``read_profile`` checks a file is one (every fault a BadOption naming ``profile``) and ``choose``
picks the first configuration of a group. The embedded pair has no path: its model is null, as
for ``Pair.load``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specmac.backends import backend_class
from specmac.core.sources import FREE as MODEL_FREE
from specmac.errors import BadOption, SpecmacError
from specmac.files import read_capped, write_json

SCHEMA = "specmac.profile"
VERSION = 1
MAX_BYTES = 16 << 20  # a profile is a few kB; a bigger file is the wrong one
AGAIN = "write it again with `specmac advise --save FILE`"


def _abs(model: str | None) -> str | None:
    return None if model is None else str(Path(model).expanduser().resolve())


def _side(variants: list[dict], backend: str, precision: str | None, model: str | None, role: str) -> dict:
    """The variant of the record that a ranking row names (its options are only there)."""
    for v in variants:
        if (v["backend"], v["precision"], v["model"]) == (backend, precision, model):
            return {"backend": backend, "model": _abs(model), "options": dict(v["options"]),
                    "precision": precision, "source": v["source"]}
    raise ValueError(f"the ranking names a {role} {backend} {precision} {model} it did not probe")


def _as_given(backend: str, model: str | None) -> bool:
    """Whether the target backend runs the file as it is (a .gguf in llama.cpp, a folder in torch or
    mlx), not a conversion of it: such a group is "the group of the target file as given"."""
    if model is None:
        return True
    fmt = "gguf" if str(model).endswith(".gguf") else "hf"
    try:
        return fmt not in backend_class(backend).converted_formats
    except SpecmacError:  # a plugin that is gone since: say nothing about it
        return False


def _kind(draft: str) -> str:
    """none, lookup (ngram, lookup: no model), hybrid (lookup+BACKEND) or model."""
    if draft in ("none", *MODEL_FREE):
        return "none" if draft == "none" else "lookup"
    return "hybrid" if "+" in draft else "model"


def build_profile(record: dict) -> dict:
    """The profile of a ranking record (``rank_configurations`` with ``provenance`` added)."""
    groups: dict[str, dict] = {}
    sampler = record["sampling"].get("sampler", "rejection")
    for e in record["ranking"]:
        target = _side(record["targets"], e["target"], e["target_dtype"], e["target_model"], "target")
        if e["draft"] == "none":
            draft = {"kind": "none", "backend": "none", "model": None, "options": {}, "precision": None}
        else:
            d = _side(record["drafts"], e["draft"], e["draft_dtype"], e["draft_model"], "draft")
            draft = {"kind": _kind(e["draft"]), **d}
        g = groups.setdefault(e["group"], {"group": e["group"], "precision": target["precision"],
                                           "source": target["source"],
                                           "as_given": _as_given(e["target"], e["target_model"]),
                                           "configurations": []})
        g["configurations"].append({
            "rank": e["rank"], "target": target, "draft": draft, "k": e["k"], "sampler": sampler,
            "predicted_tokens_per_second": e["predicted_tokens_per_second"],
            "predicted_speedup": e["predicted_speedup"], "alpha": e["alpha"], "baseline": e["baseline"],
            "reason": e["reason"]})
    return {"schema": SCHEMA, "version": VERSION, "sampling": record["sampling"],
            "k_max": record["k_max"], "reference": record["reference"],
            "groups": list(groups.values()), "skipped": record["skipped"],
            "provenance": record.get("provenance")}


def save_profile(path: str | Path, record: dict) -> Path:
    """Write the profile of ``record`` atomically (a reader sees the old file or the whole new one)."""
    return write_json(path, build_profile(record))


def _bad(path, what: str, todo: str = AGAIN) -> BadOption:
    return BadOption(f"profile {path} {what}: {todo}", param="profile")


def read_profile(path: str | Path) -> dict:
    """The profile in ``path``, checked: missing, unreadable, not JSON, not a profile, another
    version, or a configuration without what loading needs are each a one-line BadOption."""
    try:
        data = read_capped(path, MAX_BYTES, "profile", param="profile")
    except FileNotFoundError:
        raise _bad(path, "does not exist", "write one with `specmac advise --save FILE`") from None
    except IsADirectoryError:
        raise _bad(path, "is a folder, not a file", "give the profile's file") from None
    except OSError as e:
        raise _bad(path, f"cannot be read ({e.strerror or e})",
                   "check the path and its permissions") from None
    try:
        prof = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"is not JSON ({str(e).splitlines()[0]})",
                   "give a profile written by `specmac advise --save FILE`") from None
    if not isinstance(prof, dict) or prof.get("schema") != SCHEMA:
        raise _bad(path, "is not a specmac profile (no \"schema\": \"specmac.profile\")",
                   "give a file written by `specmac advise --save FILE`")
    if prof.get("version") != VERSION:
        raise _bad(path, f"has version {prof.get('version')!r}; this specmac reads version {VERSION}")
    groups = prof.get("groups")
    if not isinstance(groups, list) or not groups:
        raise _bad(path, "holds no precision group")
    for gi, g in enumerate(groups):
        if not (isinstance(g, dict) and isinstance(g.get("group"), str)
                and isinstance(g.get("configurations"), list) and g["configurations"]):
            raise _bad(path, f"is malformed (groups[{gi}] has no name or no configurations)")
        for ci, c in enumerate(g["configurations"]):
            if not _loadable(c):
                raise _bad(path, f"is malformed (groups[{gi}].configurations[{ci}] lacks a target, a "
                                 "draft or K)")
    return prof


def _loadable(c: Any) -> bool:
    def side(s: Any) -> bool:
        return (isinstance(s, dict) and isinstance(s.get("backend"), str)
                and (s.get("model") is None or isinstance(s["model"], str))
                and isinstance(s.get("options", {}), dict))
    k = c.get("k") if isinstance(c, dict) else None
    return (isinstance(c, dict) and side(c.get("target")) and side(c.get("draft"))
            and isinstance(k, int) and not isinstance(k, bool) and k >= 0)


def choose(prof: dict, path: str | Path, precision: str | None = None,
           target_model: str | None = None) -> tuple[dict, dict, str]:
    """-> (group, configuration, why): the first configuration of the group ``precision`` names
    (a group's full name or its precision, any case), or of the group of the target file
    ``target_model`` (the one running the file as given, else the best holding it), or (neither)
    of the profile's first group. The models it names must still exist."""
    groups = prof["groups"]
    why = "the profile's first choice"
    if target_model is not None:
        want = _abs(target_model)
        groups = [g for g in groups if any(c["target"].get("model") == want for c in g["configurations"])]
        if not groups:
            held = sorted({c["target"]["model"] or "the embedded target" for g in prof["groups"]
                           for c in g["configurations"]})
            raise BadOption(f"target_model {target_model} is in no group of profile {path} (its targets: "
                            f"{', '.join(held)}): give one of them, or drop --target-model",
                            param="target_model")
        # the file in its own precision (not a conversion of it) first, then the rest as ranked
        groups = sorted(groups, key=lambda g: not g.get("as_given", False))
        why = f"the group of --target-model {target_model}"
    if precision is not None:
        named = [g for g in groups if g["group"].lower() == precision.lower()]
        named = named or [g for g in groups if str(g.get("precision", "")).lower() == precision.lower()]
        if not named:
            names = ", ".join(repr(g["group"]) for g in groups)
            raise BadOption(f"precision {precision!r} is no group of profile {path}"
                            + (" holding that target" if target_model else "")
                            + f" (its groups: {names}): name one of them", param="precision")
        if len(named) > 1:
            names = ", ".join(repr(g["group"]) for g in named)
            raise BadOption(f"precision {precision!r} matches several groups of profile {path} ({names}): "
                            "give the group's full name", param="precision")
        groups, why = named, f"--precision {precision}"
    group = groups[0]
    config = group["configurations"][0]
    for role in ("target", "draft"):
        model = config[role].get("model")
        if model is not None and not Path(model).exists():
            raise _bad(path, f"names a {role} model that is gone ({model})",
                       "restore the file, or run `specmac advise --save FILE` again")
    return group, config, why


def load_kwargs(config: dict) -> dict:
    """What ``Pair.load`` (and the CLI's load_pair) takes for a configuration."""
    t, d = config["target"], config["draft"]
    return {"target": t["backend"], "target_model": t.get("model"),
            "target_options": dict(t.get("options", {})),
            # a lookup's or a hybrid's backend is its drafter's name (ngram, lookup, lookup+gguf)
            "draft": "none" if d.get("kind") == "none" else d["backend"],
            "draft_model": d.get("model"), "draft_options": dict(d.get("options", {}))}


def describe(prof: dict, group: dict, config: dict, path: str | Path, why: str) -> str:
    """One line: which configuration of which file is served, why this one, and what advise
    predicted for it (at the sampling it measured: requests bring their own)."""
    t, d, k = config["target"], config["draft"], config["k"]
    target = f"{t['backend']} {t.get('precision') or ''}".strip() + " target"
    if k == 0 or d.get("kind") == "none":
        what = f"plain {target}"
    else:
        src = ({"ngram": "ngram lookup", "lookup": "prompt lookup"}.get(d["backend"], d["backend"])
               if d.get("kind") == "lookup" else f"{d['backend']} {d.get('precision') or ''}")
        what = f"{src.strip()} draft \u2192 {target}, K {k}"
    sp = config.get("predicted_speedup")
    temp = (prof.get("sampling") or {}).get("temperature")
    at = "" if temp is None else " greedy" if temp == 0 else f" at T = {temp}"
    pred = f", predicted {sp:.2f}x{at}" if isinstance(sp, (int, float)) else ""
    return f"first choice of group {group['group']} in {path} ({why}): {what}{pred}"
