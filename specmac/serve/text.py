"""Token ids -> text pieces for a response: whole characters only, and never a stop string.

``TextOut.push(ids)`` decodes the new ids with the ids before them as context (a token can end
mid-character, and a tokenizer may join pieces differently than one at a time) and returns only
the new text that is safe to send: a trailing incomplete UTF-8 sequence (decoded as U+FFFD) waits
for the next token, and so does any tail that could be the start of a stop string, so a stop
string that spans tokens is cut before any of it is sent. Also the chat fallback for a model
without a chat template.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
# messages -> prompt for a model without a chat template (the embedded pair): said once in the log
FALLBACK_FORMAT = "one line per message, '<role>: <content>', then 'assistant:'"


def fallback_chat(messages: Sequence[dict]) -> str:
    """The documented format for a target without a chat template: "role: content" lines, then
    "assistant:" for the turn to generate."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


class TextOut:
    """The text of a growing list of ids, released as it becomes safe to send."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = ()) -> None:
        self.decode, self.stops = decode, [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already released
        self.stopped = False  # a stop string was found: nothing more is released
        self.text = ""
        # decoded a short window at a time (linear, not a whole decode per step): ids[:read] are
        # text that is final (``stable``); ids[prefix:read] give the next ids their context
        self.stable, self.prefix, self.read = "", 0, 0

    def push(self, ids: Sequence[int], final: bool = False) -> str:
        """Add ids; -> the text newly safe to send ('' if none). ``final``: the generation ended, so
        held-back text (an incomplete character, a possible stop prefix) is released."""
        if self.stopped:
            return ""
        self.ids += ids
        before = self.decode(self.ids[self.prefix:self.read])
        now = self.decode(self.ids[self.prefix:])
        self.text = self.stable + now[len(before):]
        if not now.endswith(REPLACEMENT):  # whole characters: the window moves on
            self.stable, self.prefix, self.read = self.text, self.read, len(self.ids)
        cut = self._find_stop()
        if cut is not None:
            self.stopped = True
            self.text = self.text[:cut]
            return self._release(cut)
        end = len(self.text)
        if not final:
            while end > self.sent and self.text[end - 1] == REPLACEMENT:
                end -= 1  # maybe the first bytes of a character the next token completes
            end -= self._stop_prefix(self.text[:end])
        return self._release(max(end, self.sent))

    def _release(self, end: int) -> str:
        piece, self.sent = self.text[self.sent:end], end
        return piece

    def _find_stop(self) -> int | None:
        """The index of the earliest stop string in the unsent text (with the overlap a stop
        string that started in held-back text needs)."""
        best = None
        for s in self.stops:
            i = self.text.find(s, max(0, self.sent - len(s) + 1))
            if i >= 0 and (best is None or i < best):
                best = i
        return best

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest tail of text that begins some stop string (0 if none)."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
