"""The backend contract, the registry and ``load_backend``.

A backend is anything that can *append tokens and return the logits at every appended position in
one forward pass* (``score``) and *forget everything after position n* (``rewind``). Built-ins are
registered exactly like plugins (entry-point group ``specmac.backends``); this module imports no ML
framework: only ``backend_class`` imports a backend module, on first use.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from specmac.backends.held import Saved, appends, appends_many, cuts, restores
from specmac.backends.interrupt import import_held
from specmac.backends.options import Option  # noqa: F401  (part of the contract's face)
from specmac.errors import (
    BackendNotInstalled,
    BadOption,
    BadTokens,
    BrokenBackend,
    ContextOverflow,
    SpecmacError,
    UnknownBackend,
)
from specmac.vocab import Vocab

ENTRY_POINT_GROUP = "specmac.backends"

# name -> "module:Class"; plugins add to this through the entry-point group
BUILTINS: dict[str, str] = {
    "synthetic": "specmac.backends.synthetic:SyntheticBackend",
    "mlx": "specmac.backends.mlx:MLXBackend",
    "gguf": "specmac.backends.gguf:GGUFBackend",
    "torch": "specmac.backends.torch:TorchBackend",
}
# the importable modules each built-in needs (checked without importing them)
REQUIRES: dict[str, tuple[str, ...]] = {
    "synthetic": (),
    "mlx": ("mlx", "mlx_lm"),
    "gguf": ("llama_cpp",),
    "torch": ("torch", "transformers", "safetensors"),
}
# the distributions whose versions results and --version report, per built-in
LIBRARIES: dict[str, tuple[str, ...]] = {
    "synthetic": (),
    "mlx": ("mlx", "mlx-lm"),
    "gguf": ("llama-cpp-python",),
    "torch": ("torch", "transformers", "safetensors"),
}


# the most CPU threads an option may ask for: more only oversubscribes, and llama.cpp and OpenBLAS
# crash (SIGSEGV) on absurd counts
MAX_THREADS = 4 * (os.cpu_count() or 1)
MAX_CTX = 1 << 20  # no context window beyond this is ever allocated

def tail_rows(rows: bool | int, n_tokens: int) -> int:
    """How many of an ask's last ``n_tokens`` positions ``score_many`` returns logits for: True
    all, False none, a number that many (at most all)."""
    return n_tokens if rows is True else max(0, min(int(rows), n_tokens))


class BaseBackend:
    """The contract between the core and a model, and its shared plumbing.

    A subclass sets ``vocab``, ``n_ctx`` (and ``model_id``, ``resolved``) and implements
    ``n_past``, ``score``, ``rewind``, ``encode`` and ``decode``:

    * ``score(tokens)`` appends tokens to the cache and returns float32 logits
      [len(tokens), n_logits], one row per appended position, in one forward pass;
    * ``rewind(n_past)`` truncates the cache to its first n_past tokens;
    * ``prefill``, ``reset`` and ``sync`` have defaults below.

    ``check_tokens`` holds the checks every backend makes before a pass, so that a bad id or an
    overflowing context is the same error on every backend. ``held`` is the token ids the cache
    holds, kept in step by the base class around every pass, rewind and reset a subclass defines
    (so a plugin has it too): a new prompt reuses the prefix its backend already holds.
    """

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for name in ("score", "prefill"):
            if name in cls.__dict__:
                setattr(cls, name, appends(cls.__dict__[name]))
        if "score_many" in cls.__dict__:
            cls.score_many = appends_many(cls.__dict__["score_many"])
        for name in ("rewind", "reset"):
            if name in cls.__dict__:
                setattr(cls, name, cuts(cls.__dict__[name]))
        if "restore" in cls.__dict__:
            cls.restore = restores(cls.__dict__["restore"])

    @property
    def held(self) -> list[int] | None:
        """The token ids in the cache (read only); None where a change outside the contract's calls
        made it unknown, until the next reset."""
        held = self.__dict__.get("_held", [] if self.n_past == 0 else None)
        return held if held is not None and len(held) == self.n_past else None

    name: ClassVar[str] = ""
    library: ClassVar[str] = ""  # distribution whose version results record
    options: ClassVar[dict[str, Option]] = {}
    vocab: Vocab
    n_ctx: int
    model_id: str = ""
    resolved: dict  # option values after defaults and hardware detection
    # the model files it loads: "gguf" (a .gguf file), "hf" (a Hugging Face folder)
    formats: ClassVar[tuple[str, ...]] = ()
    # the formats among those it loads through a conversion (its weights are the source's)
    converted_formats: ClassVar[tuple[str, ...]] = ()
    # plain decoding is usually the fastest here: advise lets such a backend write its reference text
    fast_plain: ClassVar[bool] = False
    # the cache can be saved and restored (``save``, ``restore``): a conversation's state is kept
    # while another's is served; a backend without it keeps only the sequence it holds
    can_save: ClassVar[bool] = False
    _threads: Any = None  # a threads.Fitter where the CPU thread count is fitted to the load

    @property
    def n_past(self) -> int:
        """Tokens currently in the KV cache."""
        raise NotImplementedError

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens; float32 logits [len(tokens), n_logits] at every appended position."""
        raise NotImplementedError

    def rewind(self, n_past: int) -> None:
        """Truncate the cache to its first n_past tokens."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        """ids -> text. One rule for every backend: special tokens (EOS, BOS, control tokens such
        as a chat template's markers) are not rendered."""
        raise NotImplementedError

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens; the logits of the last one [n_logits] (a backend may skip the others)."""
        return self.score(tokens)[-1]

    def apply_chat_template(self, prompt: str | Sequence[dict]) -> str:
        """One user turn (a string) or a conversation ([{"role", "content"}, ...]) through the
        model's chat template, ready for the assistant's turn."""
        raise SpecmacError(f"chat: the {self.name} backend cannot apply a chat template: give the prompt "
                           "without one", param="chat")

    def check_tokens(self, tokens: Sequence[int], n_ids: int | None = None) -> list[int]:
        """tokens as ints, after the checks every pass needs: at least one, each id below n_ids
        (default the logit width; an out-of-range id is a device-side assert on cuda and an abort
        in llama.cpp), and room in the context window."""
        ids = [int(t) for t in tokens]
        if not ids:
            raise BadTokens("tokens is empty: a pass needs at least one token id", param="tokens")
        n_ids = n_ids or self.vocab.n_logits or self.vocab.size
        if min(ids) < 0 or max(ids) >= n_ids:
            bad = next(t for t in ids if not 0 <= t < n_ids)
            raise BadTokens(f"token id {bad} is outside this model's vocabulary: ids must be in "
                            f"[0, {n_ids})", param="tokens")
        if self.n_past + len(ids) > self.n_ctx:
            raise ContextOverflow(f"{self.n_past + len(ids)} tokens exceed the context window "
                                  f"n_ctx={self.n_ctx}: shorten the prompt or raise n_ctx", param="n_ctx")
        return ids

    # --- several sequences at once (a server's requests, each in its own cache) -------------------
    can_batch: ClassVar[bool] = False  # score_many scores its lanes' tokens in one pass

    def lanes(self, n: int) -> list[BaseBackend]:
        """Up to n sequences held at once, each with this contract (this backend first, the others
        sharing its weights): fewer where it holds fewer (default itself alone). Asked once, before
        use: a backend may make its cache anew to hold them."""
        return [self]

    def score_many(self, asks: Sequence[tuple[BaseBackend, Sequence[int], bool | int]],
                   ) -> list[np.ndarray | None]:
        """Append tokens to several of its lanes (each at most once): per (lane, tokens, rows), the
        logits of the appended positions ``rows`` asks for (``tail_rows``: True every one, a
        number n the last n: a prompt's tokens read in a step's pass need none of theirs), None
        where it asks for none (a prompt's tokens, kept in the cache only). One pass where
        ``can_batch``; by default one lane after another."""
        out: list[np.ndarray | None] = []
        for lane, tokens, rows in asks:
            n = tail_rows(rows, len(tokens))
            out.append(lane.score(tokens)[len(tokens) - n:] if n else None)
            if not n:
                lane.prefill(tokens)
        return out

    def forwards(self, widths: Sequence[int]) -> list[int]:
        """The forwards ``score_many`` makes for asks of these token counts, as the tokens each
        computes: one over them all where ``can_batch`` (the planner prices a pass by it), else
        one per ask."""
        return [sum(widths)] if self.can_batch else list(widths)

    def save(self) -> Saved:
        """The cache now (``held`` known): a copy its later changes leave alone (``can_save``)."""
        raise NotImplementedError(f"the {self.name} backend cannot save its cache")

    def restore(self, saved: Saved) -> None:
        """Put back a cache this backend saved, in place of its own; ``saved`` can be restored again."""
        raise NotImplementedError(f"the {self.name} backend cannot restore a cache")

    def check_rewind(self, n_past: int) -> None:
        if not 0 <= n_past <= self.n_past:
            raise ValueError(f"cannot rewind to {n_past}: the cache holds {self.n_past}")

    def reset(self) -> None:
        self.rewind(0)

    def sync(self) -> None:
        """Backends that return numpy arrays have already synchronised; nothing to wait for."""

    def fit_threads(self) -> str | None:
        """Before a run: fit the CPU thread count to the CPUs other work leaves free (a backend
        whose count the user did not set sets ``_threads``, a threads.Fitter, and times its passes
        with it). -> what was chosen and why, or None where there is no count to fit."""
        return self._threads.start() if self._threads else None

    @property
    def thread_count(self) -> int | None:
        """The CPU threads its passes run on now; None where the count is not fitted here."""
        return self._threads.n if self._threads else None

    @property
    def threads_note(self) -> str | None:
        """The thread count now and why (a fit during a run included); None: not fitted."""
        return self._threads.why if self._threads else None

    @classmethod
    def devices(cls) -> list[str]:
        return ["cpu"]

    @classmethod
    def variants(cls, model: str | None, role: str = "target") -> list[tuple[dict[str, Any], str]]:
        """The precisions this backend can run ``model`` in (None: its default model for ``role``),
        each as (the options that select it, its name). Default: the model as it is."""
        return [({}, "native")]

    @classmethod
    def source_name(cls, model: str | None, role: str = "target") -> str:
        """The weights' name: one output distribution is one source in one precision."""
        if model is None:
            return f"{cls.name} default {role}"
        path = Path(model)
        return path.parent.name if path.name == "model.gguf" else path.name  # the cache's model.gguf

    @classmethod
    def default_files(cls, role: str = "target") -> list[str]:
        """What results fingerprint when this backend loads its default model (none: nothing)."""
        return []

    @classmethod
    def peek_vocab(cls, model: str | None, role: str = "target", **options: Any) -> Vocab | None:
        """The vocabulary without loading the weights, where the backend can read it alone
        (None: it cannot, and the vocabulary is checked after loading)."""
        return None

    @classmethod
    def parse_options(cls, raw: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in raw.items():
            if key not in cls.options:
                known = ", ".join(sorted(cls.options)) or "none"
                raise BadOption(f"unknown option {key!r} for the {cls.name} backend; known: {known}")
            out[key] = cls.options[key].parse(key, value)
        return out

    def info(self) -> dict:
        return {"backend": self.name, "model": self.model_id, "library": self.library,
                "library_version": library_version(self.library), "n_ctx": self.n_ctx,
                "options": dict(getattr(self, "resolved", {})), "vocab": self.vocab.to_dict()}

    def identity(self) -> dict:
        """What this backend's passes and caches depend on: the backend, its model (and the model
        files' size and mtime), its options, its library's version."""
        from specmac.backends.conversion.cache import signature  # noqa: I001  (it imports this module)
        info = {k: v for k, v in self.info().items() if k != "vocab"}
        model = Path(str(info.get("model") or ""))
        if model.exists():
            info["file"] = signature(model)
        return info

    def write_state(self, saved: Saved, stem: Path) -> Path:
        """Write a saved cache to ``stem`` + the backend's suffix, no pickle; -> the file written."""
        raise NotImplementedError(f"the {self.name} backend cannot write its cache")

    def read_state(self, path: Path, tokens: Sequence[int]) -> Saved:
        raise NotImplementedError(f"the {self.name} backend cannot read a cache")  # write_state's, back


def chat_messages(prompt: str | Sequence[dict]) -> list[dict]:
    """A string is one user turn; a list of messages is taken as it is."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


@functools.cache
def library_version(dist: str) -> str | None:
    """The installed version of a distribution (None: not installed), read once per process: what a
    process has imported does not change with what is installed after, and reading the metadata
    costs milliseconds, which every ``--k auto`` run would pay several times for its kept costs'
    identities."""
    try:
        return importlib.metadata.version(dist) if dist else None
    except importlib.metadata.PackageNotFoundError:
        return None


def libraries() -> list[str]:
    """numpy, every built-in's libraries, then the distributions that register plugin backends."""
    names = ["numpy", *(lib for libs in LIBRARIES.values() for lib in libs)]
    plugins = {ep.dist.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
               if ep.dist is not None} - {"specmac"}
    return names + sorted(plugins - set(names))


def registry() -> dict[str, str]:
    """Every backend name -> "module:Class": built-ins, then plugins (which cannot shadow them)."""
    names = dict(BUILTINS)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


def missing_requirements(name: str) -> list[str]:
    return [m for m in REQUIRES.get(name, ()) if importlib.util.find_spec(m) is None]


def install_hint(name: str, missing: str) -> str:
    if name in BUILTINS:
        return f"the {name} backend needs {missing}: pip install 'specmac[{name}]'"
    return f"the {name} backend needs {missing}: install the package that provides it"


def backend_class(name: str) -> type:
    """Import and return the class registered as ``name``."""
    reg = registry()
    if name not in reg:
        raise UnknownBackend(f"unknown backend {name!r}; choose one of: {', '.join(sorted(reg))}")
    missing = missing_requirements(name)
    if missing:
        raise BackendNotInstalled(install_hint(name, missing[0]))
    module, _, attr = reg[name].partition(":")
    try:
        mod = import_held(module)  # Ctrl-C waits for the import (torch's aborts the process)
    except ModuleNotFoundError as e:  # a plugin's own dependency
        raise BackendNotInstalled(install_hint(name, e.name or str(e))) from None
    except Exception as e:  # a plugin that raises at import must not take the CLI down with it
        first = (str(e).strip().splitlines() or [""])[0]
        raise BrokenBackend(f"the {name} backend fails to import ({module}: {type(e).__name__}"
                            f"{': ' + first if first else ''}): fix or uninstall the package that "
                            "provides it") from None
    cls = getattr(mod, attr, None) if attr else None
    if not (isinstance(cls, type) and issubclass(cls, BaseBackend)):
        what = "does not exist" if cls is None else "is not a BaseBackend subclass"
        raise BrokenBackend(f"the {name} backend's entry point {reg[name]!r} {what}: fix or uninstall "
                            "the package that provides it")
    return cls


def available(name: str) -> bool:
    """Can ``name`` be loaded here? Built-ins: their frameworks are importable (checked without
    importing them); plugins: their class imports."""
    if name in BUILTINS:
        return not missing_requirements(name)
    try:
        backend_class(name)
    except SpecmacError:
        return False
    return True


def load_backend(name: str, model: str | None = None, options: dict[str, Any] | None = None,
                 role: str = "target") -> BaseBackend:
    """Instantiate a backend. model None = the embedded pair (``role`` picks draft or target)."""
    cls = backend_class(name)
    return cls(model, role=role, **cls.parse_options(options or {}))
