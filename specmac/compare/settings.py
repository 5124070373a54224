"""What ``specmac compare`` runs: pairings, K values, prompts, sampling, and each backend's models and
options (from the command line and a TOML config, checked per table and key)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specmac.backends import available, registry
from specmac.core.costs import K_LIMIT
from specmac.core.sampling import SamplingParams
from specmac.core.sources import FREE as MODEL_FREE
from specmac.core.sources import split_draft
from specmac.errors import BadOption
from specmac.files import read_capped

PLAIN = "none"  # the "drafter" of a plain-decoding configuration
AUTO = "auto"  # K chosen every step by the cost model, measured like any K
BACKEND_KEYS = ("draft_model", "target_model", "options", "draft_options", "target_options")
FORMAT = "specmac.compare/1"


# --- what to run ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PairSpec:
    """A pairing to measure: draft backend (or "ngram", "lookup", "LOOKUP+BACKEND") -> target backend."""

    draft: str
    target: str

    @property
    def draft_backend(self) -> str:
        """The backend whose models and options the draft takes ("gguf" of "lookup+gguf")."""
        parts = split_draft(self.draft)
        return parts[1] if len(parts) == 2 else self.draft

    @property
    def id(self) -> str:
        return f"{self.draft}:{self.target}"


@dataclass(frozen=True)
class Config:
    """One measured configuration: a pairing at one K (an integer or "auto"), or plain decoding
    (k = 0)."""

    draft: str
    target: str
    k: int | str

    @property
    def k_arg(self) -> int | str:
        """What the run is given as k: "auto", or the K (plain decoding drafts nothing anyway)."""
        return self.k if self.k == AUTO else max(int(self.k), 1)

    @property
    def id(self) -> str:
        return f"{PLAIN}:{self.target}" if self.plain else f"{self.draft}:{self.target}:k{self.k}"

    @property
    def plain(self) -> bool:
        return self.draft == PLAIN


@dataclass
class Settings:
    """Everything ``run_compare`` needs; ``backends`` maps a backend name to its model and options
    (keys of BACKEND_KEYS, as read from the TOML config and the command line)."""

    pairs: list[PairSpec]
    ks: list[int | str]  # integers, then "auto" if asked
    prompts: list[dict]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(0.0))
    max_tokens: int = 64
    repeats: int = 3
    seed: int = 0
    warmup_tokens: int = 8
    backends: dict[str, dict] = field(default_factory=dict)
    # the pairs are every combination (no --pair): drop those whose vocabularies differ, and say so
    skip_unpairable: bool = False
    chat: bool = False  # prompts go through each target's chat template
    max_tokens_for: dict[str, int] = field(default_factory=dict)  # category -> its prompts' new tokens

    def prompt_text(self, target: Any, prompt: dict) -> str:
        """What ``target`` (a backend) is given for ``prompt``: its chat template applied to the
        prompt's messages with ``chat``, else the prompt's text."""
        if self.chat:
            return target.apply_chat_template(prompt.get("messages") or prompt["text"])
        return prompt["text"]

    def configs(self) -> list[Config]:
        """Grouped by target: its baseline, then each of its pairings at every K (measuring
        order within a round, so a baseline sits next to the runs it is compared with)."""
        out = []
        for target in dict.fromkeys(p.target for p in self.pairs):
            out.append(Config(PLAIN, target, 0))
            out += [Config(p.draft, target, k) for p in self.pairs if p.target == target for k in self.ks]
        return out

    def n_runs(self) -> int:
        """Generations run in total, the warm-up round included (for a progress bar)."""
        return len(self.configs()) * (1 + len(self.prompts) * self.repeats)

    def to_dict(self) -> dict:
        return {"pairs": [p.id for p in self.pairs], "k": list(self.ks),
                "prompts": [p["id"] for p in self.prompts], "sampling": self.params.to_dict(),
                "max_tokens": self.max_tokens, "repeats": self.repeats, "seed": self.seed,
                "warmup_tokens": self.warmup_tokens, "backends": self.backends, "chat": self.chat,
                "max_tokens_for": self.max_tokens_for,
                "categories": {p["id"]: p.get("category", "") for p in self.prompts}}


def parse_pair(text: str) -> PairSpec:
    """"DRAFT:TARGET" -> PairSpec; DRAFT is a backend, "ngram", "lookup" or LOOKUP+BACKEND (a
    hybrid), TARGET a backend."""
    draft, sep, target = text.strip().partition(":")
    if not sep or not draft or not target:
        raise BadOption(f"pair {text!r} is not DRAFT:TARGET: write e.g. mlx:gguf", param="pairs")
    names = registry()
    try:
        hybrid = split_draft(draft) if draft != PLAIN else []
        hybrid = hybrid if len(hybrid) == 2 else None
    except BadOption as e:
        raise BadOption(f"pair {text!r}: {e}", param="pairs") from None
    for role, name in (("draft", hybrid[1] if hybrid else draft), ("target", target)):
        if name not in names and not (role == "draft" and name in MODEL_FREE and not hybrid):
            extra = ", ngram, lookup or LOOKUP+BACKEND" if role == "draft" else ""
            raise BadOption(f"pair {text!r}: unknown {role} backend {name!r}; choose one of "
                            f"{', '.join(sorted(names))}{extra}", param="pairs")
    return PairSpec(draft, target)


def parse_pairs(texts: Sequence[str]) -> list[PairSpec]:
    """Every --pair, in order and without repeats; none (or "all") means every combination of the
    installed model backends (synthetic left out), plus ngram -> each of them."""
    if not texts or "all" in texts:
        real = [n for n in registry() if n != "synthetic" and available(n)]  # broken plugins skipped
        if not real:
            raise BadOption("no model backend is installed: pip install 'specmac[all]' or name the pairs",
                            param="pairs")
        texts = [*(t for t in texts if t != "all"), *(f"{d}:{t}" for t in real for d in [*real, "ngram"])]
    return list(dict.fromkeys(parse_pair(t) for t in texts))


def parse_ks(text: str) -> list[int | str]:
    """"1,2,4", "1-8" or "auto" (or a mix) -> sorted distinct integers >= 1, then "auto"."""
    ks: set[int] = set()
    auto = False
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part == AUTO:
            auto = True
            continue
        lo, dash, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if dash else (int(part), int(part))
        except ValueError:
            raise BadOption(f"k {text!r} is not a list of integers or auto: write e.g. 1,2,4, 1-8 or 1,auto",
                            param="k") from None
        if not 1 <= a <= b <= K_LIMIT:  # checked before the range is built
            raise BadOption(f"k {text!r} is out of range: give integers 1..{K_LIMIT} (ranges low-high), "
                            "e.g. 1,2,4,6,8", param="k")
        ks.update(range(a, b + 1))
    if not ks and not auto:
        raise BadOption(f"k {text!r} is empty: give integers 1..{K_LIMIT} or auto, e.g. 1,2,4,6,8",
                        param="k")
    return [*sorted(ks), *([AUTO] if auto else [])]


def fixed_ks(ks: Sequence[int | str]) -> list[int]:
    """The integer K of a list that may hold "auto"."""
    return [k for k in ks if k != AUTO]



def backend_settings(config: dict | None = None, *, draft_model: dict[str, str] | None = None,
                     target_model: dict[str, str] | None = None,
                     opts: Iterable[tuple[str, str, Any]] = (),
                     draft_opts: Iterable[tuple[str, str, Any]] = (),
                     target_opts: Iterable[tuple[str, str, Any]] = ()) -> dict[str, dict]:
    """Merge a TOML config ({backend: {draft_model, target_model, options, draft_options,
    target_options}}) with command-line values, which win. opts are (backend, key, value)."""
    out: dict[str, dict] = {}
    for name, table in (config or {}).items():
        out[name] = check_table(name, table)
    for key, given in (("draft_model", draft_model), ("target_model", target_model)):
        for name, path in (given or {}).items():
            out.setdefault(name, {})[key] = path
    for key, triples in (("options", opts), ("draft_options", draft_opts), ("target_options", target_opts)):
        for name, k, v in triples:
            out.setdefault(name, {}).setdefault(key, {})[k] = v
    return out


def check_table(name: str, table: Any) -> dict:
    """One [backend] table of the config: known keys, models as strings, options as tables of
    plain values (their types and ranges are the backend's to check, by option name)."""
    def bad(msg: str) -> BadOption:
        return BadOption(f"config [{name}] {msg}", param="config_path")

    if not isinstance(table, dict):
        raise bad(f"is not a table: write [{name}] with keys {', '.join(BACKEND_KEYS)}")
    for key, value in table.items():
        if key not in BACKEND_KEYS:
            raise bad(f"has an unknown key {key!r}: use {', '.join(BACKEND_KEYS)}")
        if key.endswith("_model") and not isinstance(value, str):
            raise bad(f"{key} = {value!r} is not a string: give the model's path in quotes")
        if key.endswith("options"):
            if not isinstance(value, dict):
                raise bad(f"{key} = {value!r} is not a table: write {key} = {{ n_threads = 2 }}")
            for k, v in value.items():
                if not isinstance(v, (str, int, float, bool)):
                    raise bad(f"{key}.{k} = {v!r} is not a string, number or boolean")
    return {k: (dict(v) if k.endswith("options") else v) for k, v in table.items()}


MAX_CONFIG_BYTES = 1 << 20


def read_config(path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise BadOption("a TOML config needs Python >= 3.11 or the tomli package: pip install tomli",
                            param="config_path") from None
    try:
        return tomllib.loads(read_capped(path, MAX_CONFIG_BYTES, "config", "config_path").decode("utf-8"))
    except OSError as e:
        raise BadOption(f"cannot read config {path}: {e.strerror}", param="config_path") from None
    except tomllib.TOMLDecodeError as e:
        raise BadOption(f"config {path} is not valid TOML: {e}", param="config_path") from None
    except UnicodeDecodeError as e:
        raise BadOption(f"config {path} is not UTF-8 text (byte {e.start}): save it as UTF-8",
                        param="config_path") from None


def model_and_options(backends: dict[str, dict], name: str, role: str) -> tuple[str | None, dict]:
    """The model path and options of backend ``name`` loaded as ``role`` (role options win)."""
    s = backends.get(name, {})
    return s.get(f"{role}_model"), {**s.get("options", {}), **s.get(f"{role}_options", {})}
