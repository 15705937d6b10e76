"""The schema data model every part of headstart shares.

A `Schema` is what a loader (SQLite, Spider/BIRD json, PostgreSQL) returns and
what the prompt renderer, the table-cache foreign-key graph and the evaluator
consume. It is a plain, immutable value: loaders build it once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class SchemaError(ValueError):
    """A schema could not be loaded or is unusable (unknown db, empty, unreadable)."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str = ""
    not_null: bool = False


@dataclass(frozen=True)
class ForeignKey:
    """`columns` of the owning table reference `ref_columns` of `ref_table`.

    Composite keys have several columns; a self-reference has
    `ref_table == owning table`.
    """

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name.lower() == name.lower():
                return col
        raise SchemaError(f"table {self.name!r} has no column {name!r}")


@dataclass(frozen=True)
class Schema:
    """A database schema: tables in their declared order.

    `db_id` names the database (Spider id, file stem or PostgreSQL db/schema);
    `source` says where it came from (a path or a redacted DSN), for messages.
    """

    db_id: str
    tables: tuple[Table, ...]
    source: str = ""
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name.lower() == name.lower():
                return t
        raise SchemaError(f"database {self.db_id!r} has no table {name!r}")

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    def subset(self, names: list[str]) -> "Schema":
        """The schema restricted to `names`, in the order given (schema linking)."""
        return Schema(self.db_id, tuple(self.table(n) for n in names), self.source, self.extras)
