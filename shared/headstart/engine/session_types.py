"""The plain data of a typing session (`headstart.engine.session`): its
limits, its statistics, and the record of an extension it has in flight."""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(eq=False)
class InFlight:
    """The extension a step of this session has in flight: the ids it will
    leave in the cache (None for an answer-ahead step), how many of them
    were cached before it, and whether a newer snapshot made it useless
    (polled between decoder layers: it then stops)."""

    ids: list[int] | None
    base: int
    superseded: bool = False


@dataclass(frozen=True)
class SessionLimits:
    max_text_chars: int = 4000
    max_prompt_tokens: int = 8192
    chunk_tokens: int = 256  # a submit waits at most one chunk of typing prefill
    answer_ahead_tokens: int = 32  # greedy answer tokens decoded during a pause (0 = off)
    # while answers stream, typing commits settled words only until the text has
    # not changed for this long (`SessionSteps._contended_target`; 0: always all)
    typing_settle_s: float = 0.3
    # ... and settled words only once this many of them are new (`policy.riding_target`)
    typing_bulk_tokens: int = 16
    # prompt-lookup drafts per greedy decode step (`engine.prompt_lookup`; 0: none)
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


