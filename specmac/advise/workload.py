"""advise's prompts as a workload: the reference text per prompt, with its category, through the
target's chat template when asked, and the predictions broken down by category.

A prompt is a string or a workload prompt (``{"id", "category", "text", "messages"}``, see
``specmac.compare.workloads``). ``chat`` is True (the target's chat template, refused where it has
none), False (the text as it is) or None (the template where the target has one, else the text).
A prompt longer than the target's context window leaves for the run keeps its last tokens (the
text the target continues), and the reference says how many were cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specmac.api import Pair
from specmac.backends import BaseBackend
from specmac.core.sampling import SamplingParams
from specmac.errors import SpecmacError
from specmac.tuning.timing import Progress

MARGIN = 18  # context left beyond the run for the widest verification pass (K <= 16, + the bonus)


def as_prompts(prompts: Sequence[str | dict]) -> list[dict]:
    """Strings become one-turn prompts without a category."""
    return [p if isinstance(p, dict) else {"id": f"p{i}", "category": "", "text": p,
                                           "messages": [{"role": "user", "content": p}]}
            for i, p in enumerate(prompts, 1)]


def has_chat_template(backend: BaseBackend) -> bool:
    """Whether the backend's model has a chat template (its ``apply_chat_template`` says it has none
    with a SpecmacError about ``chat``)."""
    try:
        backend.apply_chat_template([{"role": "user", "content": "hi"}])
    except SpecmacError as e:
        if e.param != "chat":
            raise
        return False
    return True


@dataclass
class Reference:
    """Prompt + the target's own continuation per prompt it answered, and what the answer came from."""

    texts: list[list[int]]
    starts: list[int]
    categories: list[str]
    ids: list[str]
    chat: bool
    n_cut: int = 0  # prompts cut to their last ``cut_to`` tokens to fit the context window
    cut_to: int | None = None
    unanswered: list[str] = field(default_factory=list)  # ids of prompts the target wrote nothing after

    def groups(self) -> dict[str, list[int]]:
        """Category -> the indices of its texts, categories in the order they first appear."""
        out: dict[str, list[int]] = {}
        for i, c in enumerate(self.categories):
            out.setdefault(c, []).append(i)
        return out

    def info(self) -> dict:
        groups = self.groups()
        n = sum(len(t) - s for t, s in zip(self.texts, self.starts))
        return {"prompts": len(self.texts), "tokens": n,
                "chat": self.chat, "cut": self.n_cut, "cut_to": self.cut_to, "unanswered": self.unanswered,
                "categories": [{"category": c, "prompts": len(ix),
                                "tokens": sum(len(self.texts[i]) - self.starts[i] for i in ix)}
                               for c, ix in groups.items()]}


def reference(target: BaseBackend, prompts: Sequence[str | dict], params: SamplingParams, run_tokens: int,
              seed: int, chat: bool | None = False, progress: Progress | None = None) -> Reference:
    """The reference text the loop will verify: each prompt (through the chat template, see
    ``chat``), then ``run_tokens`` tokens the target writes after it (``progress`` hears of each)."""
    items = as_prompts(prompts)
    use_chat = has_chat_template(target) if chat is None else chat
    room = target.n_ctx - run_tokens - MARGIN
    if room < 1:
        raise SpecmacError(f"run_tokens {run_tokens} leaves no room for a prompt in the target's "
                           f"{target.n_ctx}-token context window: use fewer", param="run_tokens")
    plain = Pair(target)
    ref = Reference([], [], [], [], use_chat)
    for i, p in enumerate(items):
        if progress is not None:
            progress(f"writing the reference text, prompt {i + 1} of {len(items)}", i, len(items))
        text = target.apply_chat_template(p.get("messages") or p["text"]) if use_chat else p["text"]
        ids = plain.encode(text)
        if len(ids) > room:
            ids, ref.n_cut, ref.cut_to = ids[-room:], ref.n_cut + 1, room
        out = plain.generate(ids, params=params, max_tokens=run_tokens, seed=seed + i).token_ids
        if not out:
            ref.unanswered.append(str(p.get("id", i)))
            continue
        ref.texts.append(ids + out)
        ref.starts.append(len(ids))
        ref.categories.append(p.get("category") or "")
        ref.ids.append(str(p.get("id", i)))
    if progress is not None:
        progress("writing the reference text", len(items), len(items))
    if not ref.texts:
        hint = "" if use_chat else ", or apply the chat template (an instruct model may answer only so)"
        raise SpecmacError("the reference target wrote nothing after the prompts: give other prompts" + hint)
    return ref
