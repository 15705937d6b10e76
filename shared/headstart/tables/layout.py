"""What each table block of a database covers, and how tables are grouped for encoding.

A block holds the KV of one table's *token-stable* text: the tokens that the
table's text becomes wherever the prompt puts it. In our prompts a table is
`render_table(t) + TABLE_SEPARATOR` and is always followed by a letter (the
next `CREATE TABLE`, or the template's `Question:`), so with byte-level BPE
the statement's last pretoken `");\\n\\n"` tokenizes the same everywhere and
the whole text is stable (checked for every Spider and BIRD dev schema in
tests/test_tables_layout.py). Should a tokenizer merge across the boundary,
the stable part is the common prefix of the text's tokens over the contexts
it can meet; the remaining tokens (`rest`) are computed in every prompt.

Every group is encoded after the prompt's *head* (system prompt and template
text up to the first table): the text that precedes the tables in every
prompt. Blocks therefore saw what they will see in use, and the head's own
KV, computed the same way, is reused at assembly.

Modes: `pfk` encodes each foreign-key group (`FkGraph`) as one causal
sequence, its tables in schema order; `independent` encodes every table alone
(the paper's "w/o PFTR" ablation). The mode, the head and the layout version
are part of the blocks' schema hash, so the two never share a key.

Why schema order and not the paper's topological order: our prompts list
tables in schema order (`render_create_tables`), and a block is exact only
where the prompt puts before it what it saw when encoded. Encoded in
topological order, a table that the schema lists before a table it
references (pets_1: Student, Has_Pet, Pets; Has_Pet references Pets) had
seen the later table at other positions, and the later one had not seen it:
on Spider dev that drifted the whole-schema P0 of 3 databases of 20 (202 of
1034 questions; 7 of 11 BIRD dev databases) as far as encoding each table
alone does, and cost the real Qwen2.5-Coder-0.5B 8-9 of pets_1's 42 answers
(issue 30). In schema order a whole-schema prompt whose tables form one
group assembles to its prefill, and the tables of a foreign key are still
encoded together (the referenced one attends to the referencing one when the
schema lists it later, as the prefill does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from headstart.prompt import PromptBuilder, common_prefix_len
from headstart.schema.model import Schema, Table
from headstart.schema.render import TABLE_SEPARATOR, render_table
from headstart.tables.fk_graph import FkGraph
from headstart.tables.keys import BlockScope, schema_hash
from headstart.tables.trie import TableTrie

# 3: blocks encoded by the runner's decoder loop, each group alone (2: the padded Hugging Face
# forward, other rounding); 2: pfk groups in schema order (1: topological order)
LAYOUT_VERSION = 3
TABLE_CACHE_MODES = ("pfk", "independent")
_NEXT_TABLE = "CREATE TABLE t"  # what follows a table's separator when another table comes next


class LayoutError(ValueError):
    """The prompt does not embed the schema as the renderer writes it, or a mode is unknown."""


def encode_plain(tokenizer, text: str) -> list[int]:
    """Token ids of user-level text (special-token strings stay text), as `PromptBuilder` encodes it."""
    if not text:
        return []
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


@dataclass(frozen=True)
class TableText:
    """One table's block tokens (`ids`) and the tokens after them that are always computed (`rest`)."""

    table: str
    ids: tuple[int, ...]
    rest: tuple[int, ...] = ()


def table_text(tokenizer, table: Table, followers: Sequence[str]) -> TableText:
    """The token-stable ids of `render_table(table) + TABLE_SEPARATOR` (see module docstring).

    Raises:
        LayoutError: no token of the table is stable.
    """
    text = render_table(table) + TABLE_SEPARATOR
    alone = encode_plain(tokenizer, text)
    n = len(alone)
    for follower in followers:
        n = common_prefix_len(alone[:n], encode_plain(tokenizer, text + follower))
    if n == 0:
        raise LayoutError(f"table {table.name!r}: no token-stable prefix")
    return TableText(table.name, tuple(alone[:n]), tuple(alone[n:]))


@dataclass(frozen=True)
class TableLayout:
    """A database's blocks for one (model, dtype, mode, head): texts, groups, scope, trie.

    Build with `TableLayout.build(prompt, ...)` from the full-schema prompt.
    """

    db_id: str
    mode: str
    head_ids: tuple[int, ...]
    texts: dict[str, TableText]  # schema order
    groups: tuple[tuple[str, ...], ...]  # encode order
    scope: BlockScope
    trie: TableTrie = field(compare=False, repr=False)

    @classmethod
    def build(cls, prompt: PromptBuilder, *, model_id: str, dtype: str, mode: str) -> "TableLayout":
        """Lay out the blocks of `prompt.schema` (the whole database, in schema order).

        Raises:
            LayoutError: unknown mode, or the prompt does not contain the rendered schema.
        """
        if mode not in TABLE_CACHE_MODES:
            raise LayoutError(f"unknown table cache mode {mode!r}; valid: {', '.join(TABLE_CACHE_MODES)}")
        schema, tokenizer = prompt.schema, prompt.tokenizer
        head_ids, after_schema = _head(prompt)
        followers = [_NEXT_TABLE]
        if after_schema.startswith(TABLE_SEPARATOR) and after_schema != TABLE_SEPARATOR:
            followers.append(after_schema[len(TABLE_SEPARATOR):])
        texts = {t.name: table_text(tokenizer, t, followers) for t in schema.tables}
        trie = TableTrie()
        for text in texts.values():
            trie.insert(text.table, text.ids)
        head_digest = hashlib.sha256(",".join(map(str, head_ids)).encode()).hexdigest()[:16]
        tag = f"layout-v{LAYOUT_VERSION}:{mode}:head-{head_digest}"
        scope = BlockScope(model_id, dtype, schema.db_id, schema_hash(schema, render_tag=tag))
        return cls(schema.db_id, mode, head_ids, texts, _groups(schema, mode), scope, trie)

    def group_sequence(self, group: Sequence[str]) -> tuple[list[int], dict[str, int]]:
        """Token ids of head + the group's tables in order, and each table's first position."""
        ids = list(self.head_ids)
        offsets: dict[str, int] = {}
        for name in group:
            text = self.texts[name]
            offsets[name] = len(ids)
            ids.extend(text.ids)
            ids.extend(text.rest)
        return ids, offsets

    def group_of(self, table: str) -> tuple[str, ...]:
        """The encode group holding `table`."""
        for group in self.groups:
            if table in group:
                return group
        raise KeyError(f"{self.db_id}: no table {table!r}")

    @property
    def num_block_tokens(self) -> int:
        return sum(len(t.ids) for t in self.texts.values())


def _head(prompt: PromptBuilder) -> tuple[tuple[int, ...], str]:
    """Token ids before the first table (a prefix of P0), and the template text after the schema."""
    head_text = prompt.parts.head_text
    at = head_text.find(prompt.schema_text)
    if at < 0 or not prompt.schema_text:
        raise LayoutError(f"{prompt.schema.db_id}: the prompt template does not contain the rendered schema")
    head = prompt.parts.head_special + encode_plain(prompt.tokenizer, head_text[:at])
    # Should the head's last token merge with the first table, keep only what P0 shares.
    n = common_prefix_len(head, prompt.base_ids)
    return tuple(head[:n]), head_text[at + len(prompt.schema_text):]


def _groups(schema: Schema, mode: str) -> tuple[tuple[str, ...], ...]:
    """Encode groups: every table alone, or each foreign-key group in schema order (module docstring)."""
    if mode == "independent":
        return tuple((t.name,) for t in schema.tables)
    index = {t.name: i for i, t in enumerate(schema.tables)}
    return tuple(tuple(sorted(group.tables, key=index.__getitem__)) for group in FkGraph.from_schema(schema).groups)
