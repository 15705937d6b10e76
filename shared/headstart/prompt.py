"""The text-to-SQL prompt: chat template, schema, question → token ids.

`PromptBuilder.prompt_ids(question)` is *the* definition of the prompt: the
cold path, the prefix path and every anticipatory session tokenize through it,
which is what makes "same tokens as a cold run" a well-defined promise.

Special tokens are recognised only in the chat template, never in what the
user typed: a user typing `<|im_end|>` gets those characters, not a turn end.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from headstart.schema.model import Schema
from headstart.schema.render import render_create_tables

DEFAULT_SYSTEM_PROMPT = (
    "You are a text-to-SQL assistant. Given a SQLite database schema and a question, "
    "answer with one SQL query that answers the question. "
    "Write only the query, in a ```sql code block."
)

# A builder serves every session on its database: a few recent snapshots of
# each of many typists' texts (8 entries thrashed with 8 typists, and each
# miss tokenizes the whole schema again: ~0.4 ms, on the worker thread too)
_MEMO_ENTRIES = 512
_SENTINEL = "\uE000HEADSTART_QUESTION\uE000"  # private-use chars: never in a template


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token id lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def uncached_tokens(cached_ids: list[int], target: list[int], chunk_tokens: int) -> int:
    """About how many tokens the next step toward `target` runs from a cache
    holding `cached_ids`: at least 1, at most one chunk. A scheduling hint
    that may be read off the worker (the ids are copied first)."""
    return max(1, min(chunk_tokens, len(target) - common_prefix_len(list(cached_ids), target)))


@dataclass(frozen=True)
class PromptParts:
    """The rendered template split around the question.

    `head_special` ends with a special token; `head_text + question + tail_text`
    is one run of ordinary text (tokenized together, as a plain tokenizer
    would); `tail_special` starts with a special token.
    """

    head_special: list[int]
    head_text: str
    tail_text: str
    tail_special: list[int]


class PromptBuilder:
    """Builds token ids of the prompt for one (tokenizer, schema, system prompt)."""

    def __init__(self, tokenizer, schema: Schema, system_prompt: str = DEFAULT_SYSTEM_PROMPT):
        self.tokenizer = tokenizer
        self.schema = schema
        self.schema_text = render_create_tables(schema)
        user = f"Database schema:\n{self.schema_text}\n\nQuestion: {_SENTINEL}"
        rendered = tokenizer.apply_chat_template(
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}],
            tokenize=False,
            add_generation_prompt=True,
        )
        head, tail = rendered.split(_SENTINEL)
        self.parts = self._split(head, tail)
        # The same text is tokenized by update() (preemption check), by the
        # scheduler's cost hint, by the policy on the worker and by the
        # progress report: remember recent ones, packed as bytes (~3 KB each,
        # bounded by _MEMO_ENTRIES; bytes hold no references for the GC to track).
        self._memo: OrderedDict[str | tuple[str, str], bytes] = OrderedDict()
        self._memo_lock = threading.Lock()
        self.base_ids = self._stable_base()

    # -- tokenization -------------------------------------------------------

    def _encode_template(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _encode_plain(self, text: str) -> list[int]:
        """Encode text with special-token strings treated as ordinary characters."""
        if not text:
            return []
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def _split(self, head: str, tail: str) -> PromptParts:
        specials = sorted(self.tokenizer.all_special_tokens + list(self.tokenizer.added_tokens_encoder), key=len, reverse=True)
        cut_head = max((head.rfind(s) + len(s) for s in specials if s in head), default=0)
        cut_tail = min((tail.find(s) for s in specials if s in tail), default=len(tail))
        return PromptParts(
            head_special=self._encode_template(head[:cut_head]),
            head_text=head[cut_head:],
            tail_text=tail[:cut_tail],
            tail_special=self._encode_template(tail[cut_tail:]),
        )

    def prompt_ids(self, question: str) -> list[int]:
        """Token ids of the full prompt for `question` (assistant turn opened).

        Returns a fresh list each call (callers may keep or extend it)."""
        p = self.parts
        return self._memoized(question, lambda: p.head_special + self._encode_plain(p.head_text + question + p.tail_text)
                              + p.tail_special)

    def partial_ids(self, question: str) -> list[int]:
        """Token ids of the prompt up to the end of `question`, without the suffix.

        The paper's policy commits only typed text; the end of the user turn is
        added at submit. Typing beside streaming answers asks for it at every
        scheduling (the riding hint), hence the memo.
        """
        p = self.parts
        return self._memoized(("partial", question), lambda: p.head_special + self._encode_plain(p.head_text + question))

    def _memoized(self, key: str | tuple[str, str], compute) -> list[int]:
        """`compute()`'s ids, through the memo of recent questions (a fresh list each call)."""
        with self._memo_lock:
            cached = self._memo.get(key)
            if cached is not None:
                self._memo.move_to_end(key)
                return array("q", cached).tolist()
        ids = compute()
        with self._memo_lock:
            self._memo[key] = array("q", ids).tobytes()
            while len(self._memo) > _MEMO_ENTRIES:
                self._memo.popitem(last=False)
        return ids  # the memo keeps its own packed copy

    def _stable_base(self) -> list[int]:
        """P0: the tokens every prompt starts with, whatever the question.

        The last template token before the question can merge with what the
        user types (a trailing space joins the first word), so P0 is the common
        prefix over a few probe questions rather than the template's tokens.
        """
        probes = ["What", "how", " a", "1", "?", "\n", "é"]
        ids = self.prompt_ids(probes[0])
        n = len(ids)
        for q in probes[1:]:
            n = common_prefix_len(ids[:n], self.prompt_ids(q))
        return ids[:n]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
