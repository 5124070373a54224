"""The peers' own decoders, timed as specmac is (prompt processing included), for the bench scripts.

* ``HFGenerate``: transformers' ``generate`` on a torch backend's loaded model (the same weights
  and dtype), greedy, plain or with ``prompt_lookup_num_tokens``;
* ``LlamaGenerate``: llama-cpp-python's ``Llama`` on a GGUF file, greedy, plain or with its
  prompt-lookup draft (``LlamaPromptLookupDecoding``).

Each is called with the prompt as the target sees it (chat template applied) and the number of new
tokens, and returns {tokens, seconds, tokens_per_second, ttft_s, text}.
"""

from __future__ import annotations

import time
from pathlib import Path


class HFGenerate:
    """transformers' own ``generate`` on the torch backend's model; ``lookup``: its
    ``prompt_lookup_num_tokens`` (None: plain greedy decoding)."""

    def __init__(self, backend, lookup: int | None) -> None:
        self.backend, self.lookup = backend, lookup

    def __call__(self, text: str, max_tokens: int) -> dict:
        import torch
        from transformers.generation.streamers import BaseStreamer

        class FirstToken(BaseStreamer):
            def __init__(self, t0: float) -> None:
                self.t0, self.calls, self.ttft = t0, 0, None

            def put(self, value) -> None:
                self.calls += 1  # the first call carries the prompt
                if self.calls == 2:
                    self.ttft = time.perf_counter() - self.t0

            def end(self) -> None:
                pass

        b = self.backend
        ids = torch.tensor([b.encode(text)], device=b.model.device)
        extra = {"prompt_lookup_num_tokens": self.lookup} if self.lookup else {}
        t0 = time.perf_counter()
        streamer = FirstToken(t0)
        with torch.inference_mode():
            out = b.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=max_tokens, streamer=streamer, **extra)
        wall = time.perf_counter() - t0
        new = out[0, ids.shape[1]:].tolist()
        while new and new[-1] in b.vocab.eos_ids:
            new.pop()
        return {"tokens": len(new), "seconds": wall, "tokens_per_second": len(new) / wall,
                "ttft_s": streamer.ttft, "text": b.decode(new)}


class LlamaGenerate:
    """llama-cpp-python's ``Llama`` on ``path``; ``lookup``: its prompt-lookup draft's
    ``num_pred_tokens`` (None: plain greedy decoding). 2 threads, as specmac's gguf backend here."""

    def __init__(self, path: Path, lookup: int | None, n_ctx: int = 2048, n_threads: int = 2) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from specmac.backends.gguf_files import peer_llama  # extra buffer types off on AMX builds

        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
        # its draft path reads every position's logits: without logits_all a prompt longer than
        # n_batch overruns the scores array (ValueError in Llama.eval)
        self.llm = peer_llama(path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                              draft_model=draft, logits_all=draft is not None, verbose=False)

    def __call__(self, text: str, max_tokens: int) -> dict:
        from llama_cpp import StoppingCriteriaList

        sampled = [0]

        def count(_ids, _logits) -> bool:  # called once per token the loop samples, drafts' included
            sampled[0] += 1
            return False

        self.llm.reset()  # no prefix reuse: every decoder pays for the whole prompt
        t0, ttft, pieces, finish = time.perf_counter(), None, [], None
        for chunk in self.llm.create_completion(text, max_tokens=max_tokens, temperature=0.0, top_k=1,
                                                top_p=1.0, min_p=0.0, repeat_penalty=1.0, stream=True,
                                                stopping_criteria=StoppingCriteriaList([count])):
            piece = chunk["choices"][0]["text"]
            if ttft is None:
                ttft = time.perf_counter() - t0
            pieces.append(piece)
            finish = chunk["choices"][0]["finish_reason"] or finish
        wall = time.perf_counter() - t0
        # the tokens written: not the chunks (the stream ends with an empty one that carries the finish
        # reason, and holds back a token that ends inside a UTF-8 character) but the tokens sampled,
        # less the call create_completion makes after its loop, and less the end-of-generation token
        # where that is what stopped it (no stop strings are given)
        n = sampled[0] - 1 - (finish == "stop")
        return {"tokens": n, "seconds": wall, "tokens_per_second": n / wall, "ttft_s": ttft,
                "text": "".join(pieces), "finish_reason": finish}
