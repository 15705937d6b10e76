"""Deterministic names for table blocks: the block key, its index key, the schema hash.

Every block is addressed by (model, dtype, database, schema hash, table). The
key is readable and carries its whole namespace so two models, two dtypes, two
databases or two versions of one schema never share an entry:

    headstart:tables:v1:{model}:{dtype}:{db}:{schema_hash}:{table}

and the index of one scope (a Redis hash: table name -> block key) is

    headstart:tables:v1:{model}:{dtype}:{db}:{schema_hash}:#index

Each part is sanitized to `[A-Za-z0-9._-]`; a part that had to change gets
`~` and 8 hex digits of the sha256 of the original appended, so
`Qwen/Qwen2.5` and `Qwen_Qwen2.5` stay distinct. A sanitized part can never
contain `#`, `:` or a glob character, so `#index` never names a table and a
key prefix is safe to use in a Redis `SCAN MATCH` pattern.

Nothing here uses Python's `hash()`: keys are shared across processes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import NewType

from headstart.schema.model import Schema

BlockKey = NewType("BlockKey", str)
SchemaHash = NewType("SchemaHash", str)

NAMESPACE = "headstart:tables:v1"
INDEX_SUFFIX = "#index"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def sanitize(part: str) -> str:
    """Map a free-form name onto `[A-Za-z0-9._-]`, keeping distinct names distinct.

    Raises:
        ValueError: `part` is empty.
    """
    if not part:
        raise ValueError("a key part must not be empty")
    clean = _UNSAFE.sub("_", part)
    if clean == part:
        return part
    digest = hashlib.sha256(part.encode("utf-8")).hexdigest()[:8]
    return f"{clean}~{digest}"


def schema_hash(schema: Schema, *, render_tag: str = "") -> SchemaHash:
    """sha256 of a canonical JSON of the schema's structure.

    Covers table order, columns (name, type, not null), primary keys and
    foreign keys: everything the foreign-key graph and the table text depend
    on. `source` and `extras` are left out (where the schema was read from
    does not change a block). `render_tag` names anything else the block text
    depends on (the prompt renderer's version, a hash of column descriptions):
    change it and every block gets a new key.
    """
    canonical = {
        "db_id": schema.db_id,
        "render_tag": render_tag,
        "tables": [
            {
                "name": t.name,
                "columns": [[c.name, c.type, c.not_null] for c in t.columns],
                "primary_key": list(t.primary_key),
                "foreign_keys": [
                    [list(fk.columns), fk.ref_table, list(fk.ref_columns)] for fk in t.foreign_keys
                ],
            }
            for t in schema.tables
        ],
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return SchemaHash(hashlib.sha256(text.encode("utf-8")).hexdigest())


@dataclass(frozen=True)
class BlockScope:
    """One set of blocks: a model and dtype over one version of one database."""

    model_id: str
    dtype: str
    db_id: str
    schema_hash: str

    @property
    def prefix(self) -> str:
        """Key prefix shared by every block of this scope (ends with ':')."""
        parts = (self.model_id, self.dtype, self.db_id, self.schema_hash)
        return NAMESPACE + ":" + ":".join(sanitize(p) for p in parts) + ":"

    @property
    def index_key(self) -> str:
        """Key of this scope's index (table name -> block key)."""
        return self.prefix + INDEX_SUFFIX

    def block_id(self, table: str) -> "BlockId":
        return BlockId(self.model_id, self.dtype, self.db_id, self.schema_hash, table)


@dataclass(frozen=True)
class BlockId:
    """The address of one table block."""

    model_id: str
    dtype: str
    db_id: str
    schema_hash: str
    table: str

    @property
    def scope(self) -> BlockScope:
        return BlockScope(self.model_id, self.dtype, self.db_id, self.schema_hash)

    @property
    def key(self) -> BlockKey:
        return BlockKey(self.scope.prefix + sanitize(self.table))


def is_index_key(key: str) -> bool:
    """True for an index key, False for a block key (both start with NAMESPACE)."""
    return key.endswith(":" + INDEX_SUFFIX)
