"""The launch options of the engines `advise --export` writes for, as their documentation states them.

Only the options an export uses are listed, each with the shape of its value, so a test can hold
every command an export emits to what the engine documents (``problems``). Each engine names the
documents and commits its options were read from: when an engine renames an option, this table is
what changes, and the docs (docs/advise.md) say which versions were checked.

Value shapes: ``path`` (a file or folder), ``int`` (a non-negative integer), ``float``, ``("choice",
{...})`` (one of), ``("list", {...})`` (comma-separated, each one of), ``("json", {key: shape})`` (a
JSON object with some of these keys).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

DTYPES = {"auto", "half", "float16", "bfloat16", "float", "float32"}  # vLLM's ModelDType, SGLang's --dtype


@dataclass(frozen=True)
class Engine:
    """One engine's launcher, the options an export may use and where they are documented."""

    name: str
    program: tuple[str, ...]  # the command before its options
    positional: int  # arguments right after the program (vLLM's model)
    options: dict[str, object]
    checked: tuple[str, ...]  # the documents read, each with its commit or version
    aliases: dict[str, str] = field(default_factory=dict)  # another documented spelling -> the one listed


LLAMA_SPEC_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}

ENGINES: dict[str, Engine] = {
    "llama-server": Engine(
        "llama-server", ("llama-server",), 0,
        {"-m": "path",  # -m, --model FNAME
         "--model-draft": "path",  # --spec-draft-model, -md, --model-draft FNAME (every build)
         "--spec-type": ("list", LLAMA_SPEC_TYPES),  # comma-separated list of types
         "--spec-draft-n-max": "int",  # tokens to draft with a draft-* type (default 3)
         "--draft-p-min": "float",  # --spec-draft-p-min, --draft-p-min P (default 0.00)
         "--spec-draft-sampling": ("choice", {"greedy", "probabilistic"}),
         "--spec-ngram-simple-size-n": "int",  # length of the lookup n-gram (default 12)
         "--spec-ngram-simple-size-m": "int"},  # length of the draft m-gram (default 48)
        ("ggml-org/llama.cpp tools/server/README.md @ 00dc8057ab28 (the options after PR #22964: "
         "--spec-draft-*, a comma list for --spec-type; earlier builds spell K --draft-max)",
         "ggml-org/llama.cpp docs/speculative.md @ a71f4a0e1db4 (the n-gram types; a draftless type mixed "
         "with a draft model takes precedence where it proposes)"),
        {"--spec-draft-model": "--model-draft", "-md": "--model-draft", "--spec-draft-p-min": "--draft-p-min",
         "--model": "-m"}),
    "vllm": Engine(
        "vllm", ("vllm", "serve"), 1,
        {"--dtype": ("choice", DTYPES),
         "--speculative-config": ("json", {
             "model": "path", "method": ("choice", {"ngram", "draft_model"}),
             "num_speculative_tokens": "int", "prompt_lookup_max": "int", "prompt_lookup_min": "int",
             "draft_sample_method": ("choice", {"greedy", "probabilistic"})})},
        ("vllm-project/vllm vllm/config/speculative.py @ 002e77c1f0ef (SpeculativeConfig: model, method, "
         "num_speculative_tokens, prompt_lookup_max/min, draft_sample_method)",
         "docs.vllm.ai features/speculative_decoding/draft_model and n_gram @ v0.25.0 (vllm serve MODEL "
         "--speculative-config JSON)")),
    "sglang": Engine(
        "sglang", ("python", "-m", "sglang.launch_server"), 0,
        {"--model-path": "path", "--dtype": ("choice", DTYPES),
         "--speculative-algorithm": ("choice", {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}),
         "--speculative-draft-model-path": "path", "--speculative-num-steps": "int",
         "--speculative-eagle-topk": "int", "--speculative-num-draft-tokens": "int",
         "--speculative-ngram-max-bfs-breadth": "int"},
        ("sgl-project/sglang docs/advanced_features/server_arguments.md @ b36e8e198b71",
         "sgl-project/sglang docs/advanced_features/speculative_decoding.md @ fc6d465375b9 (STANDALONE: "
         "num-draft-tokens = num-steps + 1 with eagle-topk 1; NGRAM)"),
        {"--model": "--model-path", "--speculative-draft-model": "--speculative-draft-model-path"}),
    "mlx-lm": Engine(
        "mlx-lm", ("mlx_lm.server",), 0,
        {"--model": "path", "--draft-model": "path", "--num-draft-tokens": "int"},
        ("ml-explore/mlx-lm mlx_lm/server.py @ 0130d3b7f169 (argparse of main())",
         "ml-explore/mlx-lm mlx_lm/server.py @ 0.32.2 (the PyPI release)")),
}


def _value_problem(shape: object, value: object) -> str | None:
    """Why ``value`` does not have ``shape`` (None: it does). Command-line values are strings."""
    text = value if isinstance(value, str) else None
    if shape == "path":
        return None if isinstance(value, str) and value else "an empty path"
    if shape == "int":
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
            text is not None and text.isdigit())
        return None if ok else f"{value!r} is not a non-negative integer"
    if shape == "float":
        try:
            float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return f"{value!r} is not a number"
        return None
    kind, allowed = shape  # type: ignore[misc]
    if kind == "choice":
        return None if value in allowed else f"{value!r} is not one of {sorted(allowed)}"
    if kind == "list":
        bad = [v for v in str(value).split(",") if v not in allowed]
        return f"{bad} not among {sorted(allowed)}" if bad else None
    try:
        obj = json.loads(value) if isinstance(value, str) else None
    except ValueError as e:
        return f"not JSON ({e})"
    if not isinstance(obj, dict):
        return "not a JSON object"
    for key, v in obj.items():
        if key not in allowed:
            return f"key {key!r} is not documented (documented: {sorted(allowed)})"
        if (shape_problem := _value_problem(allowed[key], v)) is not None:
            return f"key {key!r}: {shape_problem}"
        if allowed[key] == "int" and not isinstance(v, int):
            return f"key {key!r}: {v!r} is not a JSON integer"
    return None


def problems(engine: str, command: list[str]) -> list[str]:
    """Every way ``command`` departs from the engine's documented options: another program, an
    option not in the table, a value of the wrong shape, an option given twice."""
    e = ENGINES[engine]
    n = len(e.program)
    if tuple(command[:n]) != e.program:
        return [f"the command does not start with {' '.join(e.program)}"]
    rest, out, seen = command[n + e.positional:], [], set()
    if len(command) < n + e.positional or any(a.startswith("-") for a in command[n:n + e.positional]):
        out.append(f"{e.name} takes {e.positional} argument(s) before its options")
    for i in range(0, len(rest), 2):
        flag = e.aliases.get(rest[i], rest[i])
        if flag not in e.options:
            out.append(f"{rest[i]} is not a documented {e.name} option")
            continue
        if flag in seen:
            out.append(f"{rest[i]} is given twice")
        seen.add(flag)
        if i + 1 >= len(rest):
            out.append(f"{rest[i]} has no value")
        elif (p := _value_problem(e.options[flag], rest[i + 1])) is not None:
            out.append(f"{rest[i]}: {p}")
    return out
