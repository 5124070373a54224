"""The tokens llama-cpp-python's decoder wrote, counted as specmac counts its own, so that a peer's
tokens/s beside specmac's is of the same tokens. A benchmark that times llama-cpp-python's own loop
counts them by the rule tested here; the tests import nothing from bench/, so the rule is written
out below."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="the llama-cpp-python peer needs llama-cpp-python, not installed "
                                        "(pip install 'specmac[gguf]')")


def llama_generate(llm, text: str, max_tokens: int) -> dict:
    """Greedy decoding with llama-cpp-python's own loop, streamed: {tokens, text, finish_reason}.
    The tokens written are not the chunks (the stream ends with an empty one that carries the finish
    reason, and holds back a token that ends inside a UTF-8 character) but the tokens sampled, less
    the call create_completion makes after its loop, and less the end-of-generation token where that
    is what stopped it (no stop strings are given)."""
    from llama_cpp import StoppingCriteriaList

    sampled = [0]

    def count(_ids, _logits) -> bool:  # called once per token the loop samples, drafts' included
        sampled[0] += 1
        return False

    llm.reset()
    pieces, finish = [], None
    for chunk in llm.create_completion(text, max_tokens=max_tokens, temperature=0.0, top_k=1, top_p=1.0,
                                       min_p=0.0, repeat_penalty=1.0, stream=True,
                                       stopping_criteria=StoppingCriteriaList([count])):
        pieces.append(chunk["choices"][0]["text"])
        finish = chunk["choices"][0]["finish_reason"] or finish
    return {"tokens": sampled[0] - 1 - (finish == "stop"), "text": "".join(pieces), "finish_reason": finish}


@pytest.mark.parametrize("lookup", [None, 3])
def test_the_llama_peer_counts_the_tokens_it_wrote_not_its_stream_chunks(lookup):
    """llama-cpp-python's stream ends with an empty chunk that carries the finish reason: counting
    chunks made a 10-token completion 11 (every peer's tokens/s 1% high at 96 tokens). With its
    prompt-lookup draft too (``lookup``: its ``num_pred_tokens``)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from specmac import assets
    from specmac.api import Pair
    from specmac.backends.gguf_files import peer_llama
    from specmac.core.sampling import SamplingParams

    path = assets.gguf_file("target", "f16")
    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    # its draft path reads every position's logits: without logits_all a prompt longer than n_batch
    # overruns the scores array (ValueError in Llama.eval)
    llm = peer_llama(path, n_ctx=2048, n_threads=2, n_threads_batch=2, draft_model=draft,
                     logits_all=draft is not None, verbose=False)
    ours = Pair.load("gguf", None, target_model=str(path)).plain()
    for n in (1, 10, 37):
        r = llama_generate(llm, "def fibonacci(n):\n", n)
        g = ours.generate("def fibonacci(n):\n", params=SamplingParams(0.0), max_tokens=n, k=1)
        assert (r["tokens"], r["finish_reason"]) == (n, "length")
        assert r["text"] == g.text and len(g.token_ids) == n
