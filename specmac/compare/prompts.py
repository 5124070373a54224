"""Prompt sets: the shipped prompts (specmac/data/prompts.json: code and prose, alternating), the
packaged workload (``PACKAGED_WORKLOAD``, specmac/data/workload.jsonl: prompts by category) and
files the user gives (JSON, ``---``-separated text, or a JSON Lines workload, see
``specmac.compare.workloads``). Every prompt is {"id", "kind", "category", "text", "messages"}."""

from __future__ import annotations

import json
from importlib import resources

from specmac.compare.workloads import packaged_workload_path, parse_workload
from specmac.errors import BadOption

PACKAGED_WORKLOAD = "specmac:workload"  # the name that reads specmac/data/workload.jsonl

N_ADVISE = 4  # advise measures acceptance on the first prompts of a set
MAX_FILE_BYTES = 64 << 20


def default_prompts() -> list[dict]:
    """A dozen {"id", "kind", "text"} prompts, code and prose alternating (compare's default set)."""
    items = json.loads(resources.files("specmac").joinpath("data", "prompts.json").read_text("utf-8"))
    return [_with_messages(p) for p in items]


def _with_messages(p: dict) -> dict:
    """A one-turn prompt: its category is its kind, its messages one user turn."""
    return {**p, "category": p.get("category") or p.get("kind", ""),
            "messages": [{"role": "user", "content": p["text"]}]}


def advise_prompts() -> list[str]:
    """The texts advise measures acceptance on by default: the first four of the packaged set
    (code and prose alternating), so one easy text does not set alpha."""
    return [p["text"] for p in default_prompts()[:N_ADVISE]]


def read_prompts(path: str | None, limit: int | None = None, turns: str = "first") -> list[dict]:
    """Prompts from a .json file (a list of strings or of {"id", "text", "category"} objects), a
    .jsonl workload (Spec-Bench's shape; ``turns`` "first" or "all") or a text file (prompts
    separated by lines holding only ``---``); None gives the default set, ``PACKAGED_WORKLOAD`` the
    packaged workload."""
    if path is None:
        prompts = default_prompts()
    elif path == PACKAGED_WORKLOAD:
        prompts = parse_workload(_read_text(packaged_workload_path()), PACKAGED_WORKLOAD, turns)
    elif path.endswith(".jsonl"):
        prompts = parse_workload(_read_text(path), path, turns)
    else:
        prompts = _parse_prompts(_read_text(path), json_file=path.endswith(".json"), source=path)
    return first(prompts, limit)


def first(prompts: list[dict], limit: int | None) -> list[dict]:
    """The first ``limit`` prompts (all when None)."""
    if limit is None:
        return prompts
    if limit < 1:
        raise BadOption(f"n_prompts {limit} is out of range: use an integer >= 1", param="n_prompts")
    return prompts[:limit]


def select(prompts: list[dict], categories: list[str] | None = None, per_category: int | None = None,
           max_tokens_for: dict[str, int] | None = None) -> list[dict]:
    """The prompts of ``categories`` (all when None), the first ``per_category`` of each, and each
    prompt of a category in ``max_tokens_for`` with that many new tokens ("max_tokens"): an answer
    that rewrites a file is longer than one that answers a question."""
    known = list(dict.fromkeys(p.get("category", "") for p in prompts))
    for param, names in (("categories", categories or []), ("max_tokens_for", list(max_tokens_for or {}))):
        if unknown := [c for c in names if c not in known]:
            have = ", ".join(repr(c) for c in known)
            raise BadOption(f"{param}: no prompt has the category {unknown[0]!r}; these prompts have {have}",
                            param=param)
    if per_category is not None and per_category < 1:
        raise BadOption(f"per_category {per_category} is out of range: use an integer >= 1",
                        param="per_category")
    for cat, n in (max_tokens_for or {}).items():
        if n < 1:
            raise BadOption(f"max_tokens_for {cat}={n} is out of range: use an integer >= 1",
                            param="max_tokens_for")
    out, seen = [], dict.fromkeys(known, 0)
    for p in prompts:
        cat = p.get("category", "")
        if (categories is None or cat in categories) and (per_category is None or seen[cat] < per_category):
            seen[cat] += 1
            n = (max_tokens_for or {}).get(cat)
            out.append(p if n is None else {**p, "max_tokens": n})
    return out


def _read_text(path: str) -> str:
    """The file as strict UTF-8 (an error names the byte offset), at most MAX_FILE_BYTES."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise BadOption(f"cannot read prompts file {path}: {e.strerror}", param="prompts_path") from None
    if len(data) > MAX_FILE_BYTES:
        raise BadOption(f"prompts file {path} is larger than {MAX_FILE_BYTES >> 20} MiB: give fewer, "
                        "shorter prompts", param="prompts_path")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadOption(f"prompts file {path} is not UTF-8 text (byte {e.start}): save it as UTF-8",
                        param="prompts_path") from None


def _parse_prompts(text: str, *, json_file: bool, source: str) -> list[dict]:
    if json_file:
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadOption(f"prompts file {source} is not valid JSON ({e.msg}, line {e.lineno})",
                            param="prompts_path") from None
    else:
        blocks = "\n".join("\x00" if line.strip() == "---" else line for line in text.splitlines())
        items = [b.strip("\n") for b in blocks.split("\x00")]
    out: list[dict] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items if isinstance(items, list) else [None]):
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise BadOption(f"prompts file {source}: entry {i} is not a string or an object with 'text'",
                            param="prompts_path")
        pid, kind = item.get("id", f"p{i}"), item.get("kind", "")
        category = item.get("category", kind)
        if (isinstance(pid, bool) or not isinstance(pid, (str, int)) or not isinstance(kind, str)
                or not isinstance(category, str)):
            raise BadOption(f"prompts file {source}: entry {i} has an id that is not a string or a "
                            "kind or category that is not a string", param="prompts_path")
        if str(pid) in seen:  # runs are paired with their baseline by id
            raise BadOption(f"prompts file {source}: id {str(pid)!r} is given twice (entries "
                            f"{seen[str(pid)]} and {i}): give every prompt its own id", param="prompts_path")
        seen[str(pid)] = i
        if item["text"].strip():
            out.append(_with_messages({"id": str(pid), "kind": kind, "category": category,
                                       "text": item["text"]}))
    if not out:
        raise BadOption(f"prompts file {source} holds no prompt: give at least one non-empty prompt",
                        param="prompts_path")
    return out
