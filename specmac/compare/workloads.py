"""Workload files: JSON Lines in Spec-Bench's shape, each prompt with its category.

One object a line: ``{"question_id": ..., "category": "...", "turns": [...]}``. A turn is a string
(a user turn, as in Spec-Bench) or ``{"role": "user"|"assistant"|"system", "content": "..."}``, so a
conversation can carry earlier answers. ``turns="first"`` (Spec-Bench's first-turn setting) keeps
the first user turn (and any system turn before it); ``"all"`` keeps the whole conversation, which
must end with a user turn. Each prompt is ``{"id", "kind", "category", "text", "messages"}``:
``messages`` is what a chat template reads, ``text`` the same turns without one (joined by blank
lines). The packaged workload (specmac/data/workload.jsonl) was written for specmac: a few prompts
in each of Spec-Bench's categories plus code editing.
"""

from __future__ import annotations

import json
from importlib import resources

from specmac.errors import BadOption

TURNS = ("first", "all")
ROLES = ("system", "user", "assistant")


def packaged_workload_path() -> str:
    return str(resources.files("specmac").joinpath("data", "workload.jsonl"))


def parse_workload(text: str, source: str, turns: str = "first") -> list[dict]:
    """The prompts of a JSON Lines workload; a bad line is one BadOption naming the line."""
    if turns not in TURNS:
        raise BadOption(f"turns {turns!r} is not one of {', '.join(TURNS)}", param="turns")
    out: list[dict] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        item = _parse_line(line, source, n)
        pid = str(item.get("question_id", f"q{n}"))
        if pid in seen:  # runs are paired with their baseline by id
            raise BadOption(f"workload {source} line {n}: question_id {pid!r} is also on line {seen[pid]}: "
                            "give every prompt its own id", param="prompts_path")
        seen[pid] = n
        messages = _messages(item["turns"], source, n)
        if turns == "first":
            first = next(i for i, m in enumerate(messages) if m["role"] == "user")
            messages = messages[: first + 1]
        elif messages[-1]["role"] != "user":
            raise BadOption(f"workload {source} line {n}: the conversation ends with an "
                            f"{messages[-1]['role']} turn: end it with the user turn to answer",
                            param="prompts_path")
        category = item.get("category", "")
        out.append({"id": pid, "kind": category, "category": category, "messages": messages,
                    "text": "\n\n".join(m["content"] for m in messages)})
    if not out:
        raise BadOption(f"workload {source} holds no prompt: give at least one line", param="prompts_path")
    return out


def _parse_line(line: str, source: str, n: int) -> dict:
    def bad(what: str) -> BadOption:
        return BadOption(f"workload {source} line {n}: {what}", param="prompts_path")

    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise bad(f"is not valid JSON ({e.msg}, column {e.colno}): write one object per line") from None
    if not isinstance(item, dict):
        raise bad('is not a JSON object: write {"question_id": ..., "category": ..., "turns": [...]}')
    if "turns" not in item:
        raise bad("has no 'turns': give the prompt as \"turns\": [\"...\"]")
    if not isinstance(item["turns"], list) or not item["turns"]:
        raise bad("'turns' is not a non-empty list: give the prompt as \"turns\": [\"...\"]")
    pid = item.get("question_id", "")
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise bad(f"question_id {pid!r} is not a string or an integer")
    if not isinstance(item.get("category", ""), str):
        raise bad(f"category {item['category']!r} is not a string")
    return item


def _messages(turns: list, source: str, n: int) -> list[dict]:
    out = []
    for i, t in enumerate(turns):
        if isinstance(t, str):
            t = {"role": "user", "content": t}
        if (not isinstance(t, dict) or t.get("role") not in ROLES or not isinstance(t.get("content"), str)
                or set(t) - {"role", "content"}):
            raise BadOption(f"workload {source} line {n}: turn {i} is not a string or "
                            f'{{"role": {"|".join(ROLES)}, "content": "..."}}', param="prompts_path")
        out.append({"role": t["role"], "content": t["content"]})
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise BadOption(f"workload {source} line {n}: no user turn has text: give at least one",
                        param="prompts_path")
    return out
