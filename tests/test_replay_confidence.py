"""bench/replay_confidence.py's stopped model draft: where it stops, and what the stop costs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import replay_drafters as rd  # noqa: E402
from replay_confidence import StoppedModel, calibration  # noqa: E402

PROMPT = [1, 2, 3]
TEXT = {"prompt": PROMPT, "output": [10, 11, 12, 13, 14, 15],
        "draft_guess": [10, 11, 12, 99, 14, 15], "draft_p": [0.9, 0.8, 0.4, 0.2, 0.95, 0.9],
        "draft_guess2": [7, 7, 7, 13, 7, 7]}


def proposal(rule, k: int) -> tuple[list[int], float]:
    model = StoppedModel(TEXT, t_pass=1.0, prefill=0.0)
    model.rule = rule
    model.seen = list(PROMPT)  # caught up: the first pass costs one pass
    rd.Clock.t = 0.0
    drafts, _ = model.propose(PROMPT, k, None, None, 0)
    return drafts, rd.Clock.t


@pytest.mark.parametrize(("rule", "drafts", "passes"), [
    (("none", 0.0), [10, 11, 12, 99, 0], 5),  # the cap: k passes (past a rejected draft: unknown, 0)
    (("p_min", 0.5), [10, 11], 3),  # draft 2's p 0.4 < 0.5: seen only after the pass that scored it
    (("p_min", 0.95), [10], 2),  # the first draft is always proposed
    (("tau", 0.5), [10, 11], 3),  # 0.9 * 0.8 * 0.4 = 0.29 < 0.5 at draft 2
    (("tau", 0.25), [10, 11, 12], 4),  # 0.29 >= 0.25; with draft 3, 0.058 < 0.25
])
def test_a_draft_stops_at_its_first_unsure_token_and_pays_the_pass_that_showed_it(rule, drafts, passes):
    got, seconds = proposal(rule, 5)
    assert got == drafts
    assert seconds == pytest.approx(passes)


def test_calibration_counts_kept_guesses_per_bin():
    rows = {r["bin"]: r for r in calibration([TEXT])}
    assert rows["0.9-1"]["guesses"] == 3 and rows["0.9-1"]["kept"] == 1.0
    assert rows["0-0.3"]["guesses"] == 1 and rows["0-0.3"]["kept"] == 0.0
    assert rows["0-0.3"]["missed"] == 1 and rows["0-0.3"]["second_of_missed"] == 1.0  # 99 missed; 13 was next
    assert rows["0.9-1"]["missed"] == 0 and rows["0.9-1"]["second_of_missed"] is None
    assert rows["all"]["guesses"] == len(TEXT["output"]) and rows["all"]["missed"] == 1
    assert sum(r["guesses"] for b, r in rows.items() if b != "all") == len(TEXT["output"])


def test_second_guesses_count_the_misses_the_second_guess_would_have_caught():
    from replay_confidence import second_guesses

    # the last: a second guess equal to the output where the first was kept, not a catch
    text = {**TEXT, "category": "qa", "draft_guess2": [7, 7, 7, 13, 7, 15]}
    assert second_guesses([text], "qa") == (6, 1, 1)
    assert second_guesses([text], "summarization") == (0, 0, 0)
