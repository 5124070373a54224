"""docs/usage.md against the code it describes: every stats line run prints is explained there,
every backend option is listed with its default (from the backends' own option tables), and
advise's and compare's help name every kind of draft and `auto` for K."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from specmac.backends import BUILTINS, missing_requirements
from specmac.cli import main
from specmac.cli.render import options_markdown, stats_block
from tests.support.helpers import REPO

USAGE = (REPO / "docs" / "usage.md").read_text("utf-8")
# the label each line of the stats block starts with (the first after its token count)
LABELS = ("tokens in", "acceptance", "per-position acceptance:", "K per step:", "steps by source:",
          "pass costs:", "after the run:", "K choice:", "CPU threads:", "time:", "prediction:",
          "baseline (plain):", "interrupted:")


def section(title: str) -> str:
    start = USAGE.index(f"\n## {title}\n")
    end = USAGE.find("\n## ", start + 1)
    return USAGE[start:end if end > 0 else None]


def every_line_result() -> dict:
    """A run result that makes stats_block print every line it can."""
    return {"n_tokens": 48, "seconds": 0.5, "tokens_per_second": 96.0, "n_prompt_tokens": 9,
            "n_target_passes": 20, "finish_reason": "interrupted", "acceptance_rate": 0.5,
            "tokens_per_target_pass": 2.4, "k": "auto", "per_position_acceptance": [0.7, 0.5, None],
            "k_steps": [0, 2, 3, 3], "steps_by_source": {"gguf": 2, "lookup": 1, "none": 1},
            "k_policy": {"costs": {"note": "target: measured now"}, "settled": "kept as measured",
                         "note": "model draft not started"},
            "threads": {"target": "2 of 2"}, "time_split": {"draft": 0.1, "verify": 0.35, "other": 0.05},
            "prefill_seconds": 0.01,
            "prediction": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1,
                           "prediction_tokens": 9},
            "baseline": {"n_tokens": 48, "tokens_per_second": 80.0}, "speedup": 1.2}


def test_every_stats_line_is_explained():
    lines = stats_block(every_line_result(), speculative=True)
    labels = [next((lab for lab in LABELS if re.sub(r"^\d+ ", "", line).startswith(lab)), None)
              for line in lines]
    assert None not in labels, [line for line, lab in zip(lines, labels) if lab is None]
    assert labels == list(LABELS)  # the result above reaches every line, each once
    explained = section("What the stats mean")
    for label in LABELS[1:]:
        assert f"| `{label}` |" in explained, label
    assert "| `N tokens in S s = R tokens/s` |" in explained
    assert "`-`" in explained and "`other`" in explained  # the marks read most often


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_backend_option_is_listed_with_its_default(name):
    if missing_requirements(name):
        pytest.skip(f"the {name} backend is not installed here: its table cannot be read")
    table = options_markdown(name)
    listed = section("Backend options")
    assert f"\n### {name}\n\n{table}\n" in listed, (
        f"docs/usage.md's table of {name} differs from its option table; paste:\n{table}")


def test_backends_options_prints_the_tables():
    res = CliRunner().invoke(main, ["backends", "--options", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {"key": "n_ctx", "type": "int", "default": 4096, "choices": None,
            "help": "context window in tokens"} in rows["synthetic"]
    text = CliRunner().invoke(main, ["backends", "--options"]).stdout
    assert re.search(r"^  n_ctx +int +default 4096: context window in tokens$", text, re.M)


@pytest.mark.parametrize("command", ["advise", "compare"])
def test_help_names_every_kind_of_draft_and_auto(command):
    text = " ".join(CliRunner().invoke(main, [command, "--help"]).stdout.split())
    for word in ("none", "ngram", "lookup", "LOOKUP+BACKEND", "a backend", "auto"):
        assert word in text, (command, word)
