"""Every kind of draft source on every embedded pairing of real backends: greedy output equals plain
decoding's on the fp32 / F16 weights (the planner chooses; the text is the target's)."""

from __future__ import annotations

import pytest

from specmac.api import Pair
from specmac.core.sampling import SamplingParams
from tests.support.helpers import skip_unless_installed

GREEDY = SamplingParams(0.0)
MODELS = ["gguf", "mlx", "torch"]
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef add("


def _skip(*names):
    for n in names:
        mark = skip_unless_installed(n)
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])


def _opts(name):
    return {"dtype": "float32"} if name == "torch" else None  # the fp32 / F16 embedded weights


@pytest.mark.parametrize("target", MODELS)
@pytest.mark.parametrize("draft", MODELS)
def test_a_lookup_and_a_model_equal_plain_on_every_embedded_pairing(draft, target):
    _skip(draft, target)
    pair = Pair.load(target, f"lookup+{draft}", target_options=_opts(target), draft_options=_opts(draft))
    assert [s.name for s in pair.sources] == ["lookup", draft]
    spec = pair.generate(PROMPT, params=GREEDY, k=4, max_tokens=40)
    plain = pair.plain().generate(PROMPT, params=GREEDY, k=1, max_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert sum(spec.stats.sources.values()) == spec.stats.n_target_passes and spec.stats.n_drafted > 0


@pytest.mark.parametrize("target,draft", [("torch", "gguf"), ("gguf", "torch")])
@pytest.mark.parametrize("name", ["{d}", "lookup", "ngram", "ngram+{d}", "lookup+{d}"])
def test_every_source_under_auto_equals_plain(target, draft, name, tmp_path, monkeypatch):
    """Under k="auto" (widths chosen, models started or not, their drafts extended by a lookup's
    continuation where it pays) and with a prediction beside the sources."""
    _skip(target, draft)
    monkeypatch.setenv("SPECMAC_CACHE", str(tmp_path))
    name = name.format(d=draft)
    pair = Pair.load(target, name, target_options=_opts(target),
                     draft_options=_opts(draft) if "+" in name or name == draft else None)
    plain = pair.plain().generate(PROMPT, params=GREEDY, k=1, max_tokens=40)
    assert pair.generate(PROMPT, params=GREEDY, k="auto", max_tokens=40).token_ids == plain.token_ids
    predicted = pair.generate(PROMPT, params=GREEDY, k="auto", max_tokens=40,
                              prediction=pair.target.decode(plain.token_ids[:20]))
    assert predicted.token_ids == plain.token_ids and predicted.stats.sources.get("prediction", 0) > 0
