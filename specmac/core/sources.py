"""A draft name as the list of sources it stands for, loaded: the one factory of draft sources.

"none" (or None) is no source (plain decoding), "ngram" or "lookup" a free source, a backend name a
model source, and "FREE+BACKEND" both, e.g. "lookup+gguf" or "ngram+mlx": the planner
(``specmac.core.planner``) picks per step between them, or neither.
"""

from __future__ import annotations

from typing import Any

from specmac.backends import backend_class, load_backend
from specmac.core.drafters import Drafter, ModelDrafter, NgramDrafter
from specmac.core.lookup import LookupDrafter
from specmac.errors import BadOption
from specmac.vocab import Vocab, check_compatible

NO_DRAFT = (None, "none")
FREE = {"ngram": NgramDrafter, "lookup": LookupDrafter}  # sources without a model


def split_draft(name: str | None) -> list[str]:
    """"lookup+gguf" -> ["lookup", "gguf"]; "none" (or None) -> []. A free source leads, a model
    backend follows: anything else is a BadOption."""
    if name in NO_DRAFT:
        return []
    parts = str(name).split("+")
    if len(parts) > 2 or not all(parts) or (len(parts) == 2 and (parts[0] not in FREE or parts[1] in FREE)):
        raise BadOption(f"draft {name!r} is not SOURCE or FREE+BACKEND: write e.g. gguf, lookup, "
                        "lookup+gguf or ngram+mlx", param="draft")
    return parts


def load_sources(name: str | None, model: str | None = None, options: dict[str, Any] | None = None,
                 *, target_vocab: Vocab) -> list[Drafter]:
    """The sources ``name`` lists (``split_draft``). A backend's vocabulary is checked against the
    target's before its weights load where the backend can read a tokenizer alone, and again after."""
    parts = split_draft(name)
    check_draft_args(name, model, options)
    out: list[Drafter] = []
    for part in parts:
        if part in FREE:
            out.append(FREE[part]())
            continue
        cls = backend_class(part)
        peeked = cls.peek_vocab(model, role="draft", **cls.parse_options(options or {}))
        if peeked is not None:
            check_compatible(peeked, target_vocab)
        backend = load_backend(part, model, options, role="draft")
        check_compatible(backend.vocab, target_vocab)
        out.append(ModelDrafter(backend))
    return out


def check_draft_args(name: str | None, model: str | None, options: dict[str, Any] | None) -> None:
    """Sources without a model take no model and no options."""
    if all(p in FREE for p in split_draft(name)) and (model or options):
        raise BadOption(f"draft {name or 'none'!r} takes no draft model or draft options: drop them",
                        param="draft")
