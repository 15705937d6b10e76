"""Incremental detokenization: turn a growing list of token ids into text deltas.

Byte-level BPE splits a UTF-8 character across tokens, so a token's text alone
may end in half a character. We decode the whole prefix each time (a few
hundred tokens at most) and hold back a trailing U+FFFD until the next token
completes the character. With stop strings, the last `holdback` characters
are held back too (they could be the start of a stop string, which is never
sent); `flush` sends the rest from the final, cut text.
"""

from __future__ import annotations

from typing import Callable


class TextDeltas:
    """Feed token ids with `push`; each call returns the new whole-character text."""

    def __init__(self, decode: Callable[[list[int]], str], holdback: int = 0):
        self._decode = decode
        self._holdback = holdback
        self._ids: list[int] = []
        self._sent = 0

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        end = max(self._sent, len(text) - self._holdback)
        delta, self._sent = text[self._sent:end], end
        return delta

    def flush(self, final_text: str | None = None) -> str:
        """Whatever is left at the end: of `final_text` (the answer as the
        request ended it, a stop string cut off) or of all ids pushed (a
        dangling partial character included)."""
        text = self._decode(self._ids) if final_text is None else final_text
        delta, self._sent = text[self._sent:], max(self._sent, len(text))
        return delta
