"""The peers' own decoders, timed as specmac is (prompt processing included), for the bench scripts.

``HFGenerate``: transformers' ``generate`` on a torch backend's loaded model (the same weights and
dtype), greedy, plain or with ``prompt_lookup_num_tokens``. It is called with the prompt as the
target sees it (chat template applied) and the number of new tokens, and returns {tokens, seconds,
tokens_per_second, ttft_s, text}. llama.cpp's own decoders as peers: bench/lib/llamacpp_peer.py.
"""

from __future__ import annotations

import time


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
