"""The data-session prompt as token segments: frozen | row lines | question.

`DataPrompt` renders the chat template once with two markers, one where the
rows go and one where the question goes, and tokenizes each region on its
own. The prompt of a query is the concatenation

    frozen_ids + row_ids(row_1) + ... + row_ids(row_n) + question_ids(q)

which is *the* definition a cold prefill is compared with: rows are
tokenized one line at a time, so appending or dropping a row never changes
another row's tokens (byte-level BPE would merge across lines otherwise).
Special tokens are recognised only in the template; row text and questions
are tokenized as plain text.
"""

from __future__ import annotations

from headstart.prompt import DEFAULT_SYSTEM_PROMPT
from headstart.schema.model import Schema
from headstart.schema.render import render_create_tables

_ROWS = "\uE000DATA_ROWS\uE000"
_QUESTION = "\uE000DATA_QUESTION\uE000"

# The typing prompt's system prompt and schema text, so the frozen region shares
# the database's P0 up to the schema's end (the rows' note comes after it).
DATA_SYSTEM_PROMPT = DEFAULT_SYSTEM_PROMPT


class DataPrompt:
    """Token segments of one (tokenizer, schema) data prompt."""

    def __init__(self, tokenizer, schema: Schema, system_prompt: str = DATA_SYSTEM_PROMPT):
        self.tokenizer = tokenizer
        self.schema = schema
        user = (f"Database schema:\n{render_create_tables(schema)}\n\nRecent rows of the tables, oldest first:\n{_ROWS}"
                f"\nQuestion: {_QUESTION}")
        rendered = tokenizer.apply_chat_template(
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}],
            tokenize=False, add_generation_prompt=True,
        )
        head, rest = rendered.split(_ROWS)
        middle, tail = rest.split(_QUESTION)
        specials = sorted(tokenizer.all_special_tokens + list(tokenizer.added_tokens_encoder), key=len, reverse=True)
        cut = min((tail.find(s) for s in specials if s in tail), default=len(tail))
        # the schema's text is plain text (a column named "<|im_end|>" is characters, not a turn end)
        head_cut = max((head.rfind(s) + len(s) for s in specials if s in head), default=0)
        self.frozen_ids: list[int] = self._template(head[:head_cut]) + self._plain(head[head_cut:])
        self._question_head, self._question_tail_text = middle, tail[:cut]
        self._question_special = self._template(tail[cut:])

    def _template(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _plain(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []

    def row_ids(self, line: str) -> list[int]:
        """The tokens of one row line (with its newline)."""
        return self._plain(line + "\n")

    def question_ids(self, question: str) -> list[int]:
        """The tokens after the rows: the question and the end of the user turn."""
        return self._plain(self._question_head + question + self._question_tail_text) + self._question_special

    def ready_ids(self) -> list[int]:
        """The tokens after the rows with no question: where an answer would
        start (the paper's pre-decoded response header, §3.9.4)."""
        return self.question_ids("")

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
