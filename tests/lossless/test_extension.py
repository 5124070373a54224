"""A model's drafts extended by a free source's continuation, verified in the same pass: the
rejection rule over both keeps the target's distribution exactly (level 2, tests/support/exact.py),
and the check fails where the extension's rows carry no draft probability (its tokens then pass
without the rule)."""

from __future__ import annotations

import numpy as np
import pytest

import specmac.core.loop as loop
from specmac.api import Pair
from specmac.backends.synthetic import SyntheticBackend
from specmac.core.costs import Costs
from specmac.core.drafters import ModelDrafter
from specmac.core.lookup import LookupDrafter
from specmac.core.planner import Planner
from specmac.core.sampling import SamplingParams
from tests.support.exact import level2


@pytest.mark.slow
@pytest.mark.parametrize("planted", [False, True])
def test_extended_proposals_keep_the_targets_distribution(monkeypatch, planted):
    kw = {"vocab_size": 6, "seed": 3, "eos_bias": -3.0, "sharpness": 0.5}
    target = SyntheticBackend(role="target", **kw)
    model = ModelDrafter(SyntheticBackend(role="draft", noise=0.0, **kw))  # the target: drafts accepted
    # every width one pass and a draft pass a hundredth of it: extensions pay wherever a match runs
    # a lookup that counts 1- and 2-token matches as short and sure (no guesses): on a 6-token
    # vocabulary the model's drafts lead into such matches often enough to be extended
    planner = Planner([LookupDrafter(min_match=1, sure_match=2), model],
                      Costs([1.0] * 33, {"synthetic": 0.01}))
    # every step the model's, 2 drafts wide: room is left for an extension within the 10 tokens (the
    # choice is this test's; the rule over the model's drafts and their extension is what is tested)
    monkeypatch.setattr(planner, "choose",
                        lambda record, offers, behind, room: (1, min(2, room)) if room else (None, 0))
    seen = []
    extend = planner.extend
    monkeypatch.setattr(planner, "extend", lambda *a: seen.append(extend(*a)) or seen[-1])
    if planted:
        class NoRows(loop.OneHotRows):
            def __getitem__(self, i):
                self.drafts[i]  # an IndexError past the end, as a sequence's
                return np.zeros(self.n_vocab)

        monkeypatch.setattr(loop, "OneHotRows", NoRows)
    p = level2(Pair(target, planner.sources), SamplingParams(1.0), planner, n=1000,
               prompts=[[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])["p"]
    assert sum(len(e[1]) for e in seen if e) > 150  # extension tokens proposed over the 1000 sequences
    assert (p < 1e-6) if planted else (p > 1e-3), p
