"""Incremental detokenization: turn a growing list of token ids into text deltas.

Byte-level BPE splits a UTF-8 character across tokens, so a token's text alone
may end in half a character. We decode the whole prefix each time (a few
hundred tokens at most) and hold back a trailing U+FFFD until the next token
completes the character.
"""

from __future__ import annotations

from typing import Callable


class TextDeltas:
    """Feed token ids with `push`; each call returns the new whole-character text."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._sent = 0

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self._sent = text[self._sent:], len(text)
        return delta

    def flush(self) -> str:
        """Whatever is left at the end (a dangling partial character included)."""
        text = self._decode(self._ids)
        delta, self._sent = text[self._sent:], len(text)
        return delta
