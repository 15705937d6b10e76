"""A session's plain data: the limits it runs under and the statistics it reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionLimits:
    max_text_chars: int = 4000
    max_prompt_tokens: int = 8192
    chunk_tokens: int = 256  # a submit waits at most one chunk of typing prefill
    answer_ahead_tokens: int = 32  # greedy answer tokens decoded during a pause (0 = off)
    # while answers stream, typing takes settled words only until the text has
    # not changed for this long (`typing_work.riding_target_for`; 0: always all)
    typing_settle_s: float = 0.3
    # ... and settled words only once this many of them are new (`policy.riding_target`)
    typing_bulk_tokens: int = 16
    # prompt-lookup drafts per greedy decode step (`requests.prompt_lookup`; 0: none)
    draft_tokens: int = 0


@dataclass
class SessionStats:
    cached_tokens: int
    prompt_tokens: int
    computed_tokens: int
    wasted_tokens: int
    memory_bytes: int  # keys/values this session holds privately
    seq: int
    shared_bytes: int = 0  # of its P0, shared with the other sessions on that P0 (not copied)
