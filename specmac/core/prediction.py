"""Predicted Outputs: the text the user expects back (OpenAI's ``prediction``) as the draft source.

A rewrite of a file with a small change is mostly the file itself, so the prediction's tokens are
proposed where the generated text has reached them: the drafter keeps an alignment (the index in
the prediction of the next token it expects), advances it while the committed tokens follow the
prediction, and after an edit (a token the prediction does not have there) realigns as prompt
lookup does over the prompt: the longest suffix of the sequence (up to ``max_ngram`` tokens) found
in the prediction, the occurrence nearest at or after the old alignment first. Before any
token is generated the alignment is the prediction's start. It is one more free source beside the
pair's own (``specmac.core.drafters``): where it has no alignment it proposes nothing, and the
planner weighs its proposals against theirs.

Proposals from the prediction carry a one-hot q, as every free source's do, so the same rejection
rule keeps the target's distribution (at T > 0 a prediction token d is accepted with probability
p(d)).

Accounting (``usage``), per position of the prediction, each counted once:
  accepted: prediction positions whose token was proposed and kept by the target (it appears in
            the completion, at the place the alignment put it);
  rejected: prediction positions proposed at least once and never kept.
Prediction tokens never proposed (the run stopped first, an edit skipped them, or another source
drafted the step) are in neither. The counts are settled from the loop's events (``settle``), which
``specmac.api.Pair.stream`` feeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmac.core.drafters import Drafter


class PredictionDrafter(Drafter):
    """Drafts from ``prediction`` (token ids) where the text has reached it."""

    name = "prediction"
    priors = {"prediction": (0.5, 2.0, False)}

    def __init__(self, prediction: Sequence[int], max_ngram: int = 8, min_ngram: int = 1) -> None:
        self.pred = [int(t) for t in prediction]
        self._arr = np.asarray(self.pred, dtype=np.int64)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.pos: int | None = 0  # index in pred of the next expected token; None: lost
        self.n_seen: int | None = None  # len(seq) at the last propose (None: none yet)
        self.accepted: set[int] = set()  # prediction positions kept
        self.proposed: set[int] = set()  # prediction positions proposed
        self._offered = 0  # the prediction position of the last proposal's first draft

    def propose(self, seq, k):
        self._align(seq)
        self.n_seen = len(seq)
        if self.pos is None or self.pos >= len(self.pred) or k < 1:
            return [], ""
        self._offered = self.pos
        return self.pred[self.pos:self.pos + k], "prediction"

    def settle(self, source: str, n_drafted: int, n_accepted: int) -> None:
        """One step's verdict (the loop's event): where this prediction drafted it, its first
        n_drafted positions were proposed and the first n_accepted accepted."""
        if source == self.name and n_drafted:
            self.proposed.update(range(self._offered, self._offered + n_drafted))
            self.accepted.update(range(self._offered, self._offered + n_accepted))

    def usage(self) -> dict:
        return {"accepted_prediction_tokens": len(self.accepted),
                "rejected_prediction_tokens": len(self.proposed - self.accepted)}

    def begin(self, seq) -> None:
        """The prediction starts where the output does."""
        self.pos, self.n_seen = 0, None

    def info(self) -> dict:
        return {"drafter": self.name, "prediction_tokens": len(self.pred), "max_ngram": self.max_ngram}

    def _align(self, seq: Sequence[int]) -> None:
        if self.n_seen is None:  # the first step: nothing generated yet, the prediction starts here
            return
        new = list(seq[self.n_seen:])
        if self.pos is not None and self.pred[self.pos:self.pos + len(new)] == new and new:
            self.pos += len(new)  # the text followed the prediction
            return
        self.pos = self._realign(seq)

    def _realign(self, seq: Sequence[int]) -> int | None:
        """The index after the longest suffix of seq found in the prediction (nearest at or after
        the old alignment, else the latest before it), or None."""
        s, p = np.asarray(seq[-self.max_ngram:], dtype=np.int64), self._arr
        near = self.pos if self.pos is not None else 0
        for n in range(min(self.max_ngram, len(s), len(p)), self.min_ngram - 1, -1):
            win = np.lib.stride_tricks.sliding_window_view(p, n)
            ends = np.flatnonzero((win == s[-n:]).all(axis=1)) + n
            if len(ends):
                after = ends[ends >= near]
                return int(after[0] if len(after) else ends[-1])
        return None


def prediction_text(prediction) -> str:
    """OpenAI's prediction content: a string, or a list of text parts ({"type": "text", "text": ...})
    joined; anything else is a TypeError naming what was given."""
    if isinstance(prediction, str):
        return prediction
    if isinstance(prediction, list) and all(isinstance(x, dict) and x.get("type") == "text"
                                            and isinstance(x.get("text"), str) for x in prediction):
        return "".join(x["text"] for x in prediction)
    raise TypeError("a prediction is a string or a list of text parts {'type': 'text', 'text': ...}")
