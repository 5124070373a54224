"""The benchmarks' peers (bench/peers.py) count the tokens they wrote as specmac does, so that a
peer's tokens/s beside specmac's is of the same tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytest.importorskip("llama_cpp", reason="the llama-cpp-python peer needs llama-cpp-python, not installed "
                                        "(pip install 'specmac[gguf]')")


@pytest.mark.parametrize("lookup", [None, 3])
def test_the_llama_peer_counts_the_tokens_it_wrote_not_its_stream_chunks(lookup):
    """llama-cpp-python's stream ends with an empty chunk that carries the finish reason: counting
    chunks made a 10-token completion 11 (every peer's tokens/s 1% high at 96 tokens)."""
    from peers import LlamaGenerate

    from specmac import assets
    from specmac.api import Pair
    from specmac.core.sampling import SamplingParams

    path = assets.gguf_file("target", "f16")
    peer = LlamaGenerate(path, lookup)
    ours = Pair.load("gguf", None, target_model=str(path)).plain()
    for n in (1, 10, 37):
        r = peer("def fibonacci(n):\n", n)
        g = ours.generate("def fibonacci(n):\n", params=SamplingParams(0.0), max_tokens=n, k=1)
        assert (r["tokens"], r["finish_reason"]) == (n, "length")
        assert r["text"] == g.text and len(g.token_ids) == n
