"""The gguf backend's dealings with llama.cpp beyond one pass: one sequence's state serialised and
set back; several lanes' tokens cut into decodes of at most ``n_batch`` tokens, each token at its
lane's position in its lane's sequence; the chat template rendered; a context freed."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from specmac.backends import tail_rows
from specmac.backends.gguf_files import captured_log, first_error
from specmac.errors import SpecmacError
from specmac.vocab import Vocab


def get_state(ctx, seq: int, n_past: int) -> bytes:
    """The cells of ``seq`` in the context's KV cache, as llama.cpp serialises them."""
    size = llama_cpp.llama_state_seq_get_size(ctx, seq)
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq)
    if n == 0 and n_past:
        raise RuntimeError(f"llama.cpp cannot save the state of a sequence of {n_past} tokens")
    return bytes(buf)[:n]


def set_state(ctx, seq: int, data: bytes, n_tokens: int) -> None:
    """``seq`` set to a state ``get_state`` gave (the sequence emptied first by the caller)."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    with captured_log() as log:
        n = llama_cpp.llama_state_seq_set_data(ctx, buf, len(data), seq)
    if n == 0:
        raise SpecmacError(f"llama.cpp cannot restore a saved sequence of {n_tokens} tokens "
                           f"({first_error(log)})")


def decodes(work: Sequence[tuple], n_batch: int) -> Iterator[list[tuple]]:
    """(j, lane, tokens, rows) per lane -> the decodes: lists of (j, lane, piece, k), each at
    most ``n_batch`` tokens, k the piece's last positions whose logits are asked for (``rows`` of
    the lane's tokens are the last ones); a lane's tokens longer than that over several, in order."""
    batch: list[tuple] = []
    room = n_batch
    for j, lane, tokens, rows in work:
        first = len(tokens) - tail_rows(rows, len(tokens))  # the first position whose logits are asked
        for i in range(0, len(tokens), n_batch):
            piece = tokens[i : i + n_batch]
            if len(piece) > room:
                yield batch
                batch, room = [], n_batch
            batch.append((j, lane, piece, max(0, min(len(piece), i + len(piece) - first))))
            room -= len(piece)
    if batch:
        yield batch


def fill(b, batch: Sequence[tuple]) -> int:
    """The ``llama_batch`` ``b`` holding ``batch``'s tokens (logits asked for at each piece's last
    k): its size."""
    n = 0
    for _, lane, piece, k in batch:
        for i, t in enumerate(piece):
            b.token[n], b.pos[n], b.n_seq_id[n], b.seq_id[n][0] = t, lane._n_past + i, 1, lane._seq
            b.logits[n] = i >= len(piece) - k
            n += 1
    b.n_tokens = n
    return n


def chat_text(template: str, vocab: Vocab, eos_id: int, add_bos: bool, messages: list[dict]) -> str:
    """``messages`` through the GGUF's chat template, ready for generation (without the BOS that
    encode adds itself)."""
    tb = vocab.token_bytes
    bos = tb[vocab.bos_id].decode(errors="replace") if vocab.bos_id is not None else ""
    eos = tb[eos_id].decode(errors="replace") if eos_id >= 0 else ""
    text = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(messages=messages).prompt
    return text[len(bos):] if add_bos and bos and text.startswith(bos) else text


def release(model, ctx, batch, _abort_cb) -> None:  # the callback lives as long as the context
    with captured_log():  # llama.cpp reports buffer sizes as it frees them
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
