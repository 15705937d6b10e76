"""Confirmation policies: how much of what the user typed to cache now.

A policy is asked, on the worker, each time it may act (a new snapshot, a
debounce timer, the worker becoming free) what the cache should hold. It
answers with token ids, or None for "leave the cache as it is", and when it
wants to be asked again.

- `paper` (APITS, Sec. III-C): cache complete words at whitespace/punctuation
  boundaries after a debounce δ (consecutive boundaries confirm at once); the
  end of the user turn is added only at submit, and since no logits are kept
  the submit always recomputes the last token ("backstep").
- `headstart` (default): whenever the worker gets to this session, cache
  everything: the partial word, the end of the user turn and the opened
  assistant turn, and keep the last logits. A user who pauses before Enter
  then finds the whole prompt cached and the first token already computable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from headstart.prompt import PromptBuilder, common_prefix_len

PAPER_BOUNDARIES = frozenset(" \n\t.,;:!?")
# What a finished question ends on (Spider dev: 1028 of 1034 end on "?" or ".").
SENTENCE_ENDS = frozenset("?!.")


@dataclass(frozen=True)
class CacheTarget:
    """What the cache should hold now: `ids` (None = leave as is)."""

    ids: list[int] | None
    recheck_at: float | None = None  # monotonic time to ask the policy again
    # Only part of what the policy wants (the settled words while answers
    # stream: `typing_work.riding_target_for`); no logits kept, no answer-ahead.
    partial: bool = False


class ConfirmationPolicy(ABC):
    name: str = ""
    # Whether the cache may end on the full prompt with its logits kept, so a
    # caught-up submit needs no forward pass.
    keeps_logits: bool = True
    # Whether a newer snapshot (or the submit) may abort an extension in
    # flight whose result it would crop anyway.
    preempts: bool = True

    @abstractmethod
    def target(self, prompt: PromptBuilder, text: str, now: float, last_change: float) -> CacheTarget:
        """Called on the worker with the newest snapshot `text`, received at
        `last_change` (monotonic seconds), at time `now`."""


class HeadstartPolicy(ConfirmationPolicy):
    name = "headstart"
    keeps_logits = True

    def target(self, prompt, text, now, last_change):
        return CacheTarget(prompt.prompt_ids(text))


class PaperPolicy(ConfirmationPolicy):
    """Word-boundary targets with a debounce of `debounce_s` (default 300 ms)."""

    name = "paper"
    keeps_logits = False
    preempts = False  # the paper awaits the extension in flight

    def __init__(self, debounce_s: float = 0.3):
        if debounce_s < 0:
            raise ValueError("debounce must be >= 0")
        self.debounce_s = debounce_s

    @staticmethod
    def settled_prefix(text: str) -> str:
        """The text up to and including its last boundary character."""
        for i in range(len(text) - 1, -1, -1):
            if text[i] in PAPER_BOUNDARIES:
                return text[: i + 1]
        return ""

    def target(self, prompt, text, now, last_change):
        prefix = self.settled_prefix(text)
        if not prefix:
            return CacheTarget(None)
        double_boundary = len(text) >= 2 and text[-1] in PAPER_BOUNDARIES and text[-2] in PAPER_BOUNDARIES
        due = last_change + self.debounce_s
        if double_boundary or now >= due:
            return CacheTarget(prompt.partial_ids(prefix))
        return CacheTarget(None, recheck_at=due)


def looks_complete(text: str) -> bool:
    """Whether `text` reads as a finished question: it ends on "?" or "!",
    or on a "." that follows no digit (not "3.", which may become "3.5") and
    no other ".". A space after the mark means the user goes on."""
    if len(text) < 2 or text[-1] not in SENTENCE_ENDS:
        return False
    return text[-1] != "." or not (text[-2].isdigit() or text[-2] == ".")


def riding_target(full_ids: list[int], settled_ids: list[int], cached_ids: list[int], complete: bool,
                  bulk_tokens: int, recheck_at: float | None) -> CacheTarget:
    """What a typing session takes while its row rides with streaming
    answers (`typing_work.riding_target_for`), where each of its tokens
    lengthens every answer's forward. A `complete` text (rested, or
    `looks_complete`) takes the whole prompt with its logits: the submit
    that usually follows finds its first token ready. Otherwise only the
    settled words (`settled_ids`, up to the last word boundary) and only
    once at least `bulk_tokens` of them are new: on a CPU a token riding in
    a forward of a few tokens costs about twice what it costs among a dozen
    more (docs/benchmarks-archive.md), so words go in bulk, not one by one. The
    cache keeps whatever of the whole prompt it already holds (`cached_ids`)."""
    if complete:
        return CacheTarget(full_ids)
    cached = common_prefix_len(cached_ids, full_ids)
    settled = common_prefix_len(full_ids, settled_ids)
    keep = settled if settled - cached >= bulk_tokens else cached
    return CacheTarget(full_ids[:keep], recheck_at=recheck_at, partial=True)


POLICIES: dict[str, type[ConfirmationPolicy]] = {
    HeadstartPolicy.name: HeadstartPolicy,
    PaperPolicy.name: PaperPolicy,
}


def make_policy(name: str, **kwargs) -> ConfirmationPolicy:
    """Build a policy by name. Unknown name → ValueError listing the valid ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[name](**kwargs)
