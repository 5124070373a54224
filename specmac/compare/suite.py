"""A suite: one TOML file that says everything ``specmac compare`` measures, so that a benchmark is
re-run on another machine by one command with the model folder given once.

Its ``[compare]`` table holds compare's flags, each under the flag's name with underscores
(``max_tokens = 96``, ``pairs = ["gguf:gguf", "lookup:gguf"]``, ``k = "1-8,auto"``); every other table
is a backend's models and options (``specmac.compare.settings.check_table``). A flag given on the
command line wins over the table. A model path may name an environment variable, ``$SPECMAC_MODELS``
for the folder of the model files (``specmac.files.models_home`` when it is unset), and ``out`` may
name ``{machine}`` (``specmac.compare.results.machine_label``), so each machine's record gets a
folder of its own. Paths are relative to the folder compare runs in, as the flags' are.
"""

from __future__ import annotations

import os
import re
from typing import Any

from specmac.errors import BadOption
from specmac.files import MODELS_ENV, models_home

TABLE = "compare"
# key -> the kind of value it takes: a flag of compare given once, or given as a list
SCALAR = {"prompts": str, "turns": str, "chat": bool, "n_prompts": int, "per_category": int,
          "max_tokens": int, "ctx_size": int, "repeats": int, "warmup_tokens": int, "temperature": float,
          "top_k": int, "top_p": float, "min_p": float, "sampler": str, "seed": int, "out": str,
          "exclusive": bool}
LISTS = ("pairs", "k", "categories", "max_tokens_for")
KEYS = (*LISTS, *SCALAR)
_VAR = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def _bad(msg: str) -> BadOption:
    return BadOption(f"config [{TABLE}] {msg}", param="config_path")


def split(config: dict) -> tuple[dict, dict]:
    """(the [compare] table, the backend tables) of a config read by ``read_config``."""
    config = dict(config)
    table = config.pop(TABLE, {})
    if not isinstance(table, dict):
        raise _bad(f"is not a table: write [{TABLE}] with keys such as max_tokens = 64")
    return table, config


def flag_values(table: dict) -> dict[str, Any]:
    """The [compare] table as the values of compare's flags (key -> value in the flag's own form:
    "1,2,auto" for k, ("a:b", ...) for pairs, "CATEGORY=N" items for max_tokens_for); the flags'
    own checks then read them as they read the command line."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            raise _bad(f"has an unknown key {key!r}: use {', '.join(KEYS)}")
        if key in SCALAR:
            out[key] = _scalar(key, value, SCALAR[key])
        elif key == "pairs":
            out[key] = tuple(_strings(key, value))
        elif key == "k":
            items = value if isinstance(value, list) else [value]
            if not items or any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in items):
                raise _bad(f'k = {value!r} is not a K list: write k = "1-8,auto" or k = [1, 2, 4]')
            out[key] = ",".join(str(v) for v in items)
        elif key == "categories":
            out[key] = ",".join(_strings(key, value.split(",") if isinstance(value, str) else value))
        else:  # max_tokens_for
            if not isinstance(value, dict) or any(isinstance(n, bool) or not isinstance(n, int)
                                                  for n in value.values()):
                raise _bad(f"max_tokens_for = {value!r} is not a table of integers: write "
                           "max_tokens_for = { code_editing = 256 }")
            out[key] = tuple(f"{cat}={n}" for cat, n in value.items())
    return out


KIND_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}


def _scalar(key: str, value: Any, kind: type) -> Any:
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # a bool is an int to isinstance: only a bool key takes one
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise _bad(f"{key} = {value!r} is not {KIND_NAMES[kind]}")
    return value


def _strings(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise _bad(f'{key} = {value!r} is not a list of names: write {key} = ["..."]')
    return [v.strip() for v in value]


def expand_models(backends: dict[str, dict]) -> dict[str, dict]:
    """Every ``*_model`` path with ``~`` and ``$VAR``/``${VAR}`` expanded; $SPECMAC_MODELS falls
    back to ``models_home()``, any other variable that is not set is a BadOption naming it."""
    out = {}
    for name, table in backends.items():
        if not isinstance(table, dict):  # check_table says what is wrong with it
            out[name] = table
            continue
        out[name] = dict(table)
        for key, path in table.items():
            if key.endswith("_model") and isinstance(path, str):
                out[name][key] = os.path.expanduser(_VAR.sub(lambda m, n=name, k=key: _var(m, n, k), path))
    return out


def _var(match: re.Match, name: str, key: str) -> str:
    var = match.group(1) or match.group(2)
    if var == MODELS_ENV:
        return str(models_home())
    if var not in os.environ:
        raise BadOption(f"config [{name}] {key} names ${var}, which is not set: set it, or write the path",
                        param="config_path")
    return os.environ[var]


def out_folder(template: str) -> str:
    """``out`` with {machine} filled in (the only name it may hold)."""
    from specmac.compare.results import machine_label

    try:
        return template.format(machine=machine_label())
    except (KeyError, IndexError, ValueError):
        raise _bad(f"out = {template!r} may name only {{machine}}: write e.g. out = "
                   '"my-suite/{machine}"') from None
