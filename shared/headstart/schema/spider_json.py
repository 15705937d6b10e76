"""Load schemas from a Spider / BIRD `tables.json` file.

Each entry holds global column indices: `column_names_original` is a list of
`[table_index, name]` (index 0 is the `[-1, "*"]` placeholder),
`primary_keys` a list of column indices or, in BIRD, lists of indices for a
composite key, and `foreign_keys` a list of `[child, parent]` index pairs.
The `*_original` names are used: they are the names SQL must spell.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from headstart.schema.model import Column, ForeignKey, Schema, SchemaError, Table


def load_spider_tables(path: str | Path) -> dict[str, Schema]:
    """Every schema in the `tables.json` at `path`, keyed by db_id, in file order.

    Tables named `sqlite_*` (Spider lists `sqlite_sequence` for world_1) are
    left out, as the SQLite loader leaves them out, so both loaders give the
    same tables for the same database.

    Raises:
        SchemaError: the file is missing, not JSON, not in this format, or
            lists a db_id twice. The message names the path.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SchemaError(f"cannot read tables file {str(path)!r}: {exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SchemaError(f"tables file {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise SchemaError(f"tables file {str(path)!r} must hold a JSON list of databases")
    schemas: dict[str, Schema] = {}
    for position, entry in enumerate(raw):
        schema = _entry_to_schema(entry, position, str(path))
        if schema.db_id in schemas:
            raise SchemaError(f"tables file {str(path)!r} lists db_id {schema.db_id!r} twice")
        schemas[schema.db_id] = schema
    return schemas


def load_spider_schema(tables_json_path: str | Path, db_id: str) -> Schema:
    """The schema of `db_id` in the `tables.json` at `tables_json_path`.

    Raises:
        SchemaError: the file cannot be loaded, or `db_id` is not in it (the
            message lists close matches).
    """
    schemas = load_spider_tables(tables_json_path)
    if db_id not in schemas:
        raise SchemaError(
            f"unknown database id {db_id!r} in {str(tables_json_path)!r}; "
            + describe_close_matches(db_id, list(schemas))
        )
    return schemas[db_id]


def describe_close_matches(db_id: str, known: list[str]) -> str:
    """'did you mean: ...' for ids close to `db_id`, or the known ids when none is close."""
    exact_case = [k for k in known if k.lower() == db_id.lower()]
    close = exact_case + [
        k for k in difflib.get_close_matches(db_id, known, n=3, cutoff=0.6) if k not in exact_case
    ]
    if close:
        return "did you mean: " + ", ".join(close) + "?"
    shown = ", ".join(sorted(known)[:20]) + (", ..." if len(known) > 20 else "")
    return f"known ids: {shown}" if known else "the file lists no databases"


def _entry_to_schema(entry: object, position: int, source: str) -> Schema:
    db_id = entry.get("db_id", f"#{position}") if isinstance(entry, dict) else f"#{position}"
    try:
        return _build_schema(entry, source)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SchemaError(
            f"database {db_id!r} in {source!r} is malformed: {type(exc).__name__}: {exc}"
        ) from exc


def _build_schema(entry: dict, source: str) -> Schema:
    db_id = str(entry["db_id"])
    table_names = [str(t) for t in entry["table_names_original"]]
    columns = entry["column_names_original"]  # [[table_index, name], ...]
    types = entry["column_types"]
    if len(types) != len(columns):
        raise ValueError(f"{len(columns)} column names but {len(types)} column types")
    kept = {i for i, name in enumerate(table_names) if not name.lower().startswith("sqlite_")}

    table_columns: dict[int, list[Column]] = {i: [] for i in kept}
    for (table_index, name), col_type in zip(columns, types):
        if table_index in kept:
            table_columns[table_index].append(Column(str(name), str(col_type)))

    pk_indices = _primary_keys(entry["primary_keys"], columns)
    fks_by_table = _foreign_keys(entry["foreign_keys"], columns, table_names, pk_indices, kept)

    tables = tuple(
        Table(
            table_names[t],
            tuple(table_columns[t]),
            tuple(str(columns[i][1]) for i in pk_indices.get(t, ())),
            tuple(fks_by_table.get(t, ())),
        )
        for t in sorted(kept)
    )
    return Schema(db_id, tables, source=source)


def _primary_keys(primary_keys: list, columns: list) -> dict[int, tuple[int, ...]]:
    """Table index -> primary-key column indices, in key order.

    An int is one column, a list a composite key (BIRD). Several entries for
    one table also make a composite key, in the listed order.
    """
    result: dict[int, tuple[int, ...]] = {}
    for pk in primary_keys:
        indices = tuple(int(i) for i in (pk if isinstance(pk, list) else [pk]))
        owners = {columns[i][0] for i in indices}
        if len(owners) != 1:
            raise ValueError(f"primary key {pk!r} spans several tables")
        owner = owners.pop()
        result[owner] = result.get(owner, ()) + indices
    return result


def _foreign_keys(
    pairs: list,
    columns: list,
    table_names: list[str],
    pk_indices: dict[int, tuple[int, ...]],
    kept: set[int],
) -> dict[int, list[ForeignKey]]:
    """Child table index -> its foreign keys, in file order.

    Exact duplicate pairs are dropped (Spider has some). Consecutive pairs
    between the same two tables become one composite key only when their
    parent columns are exactly the parent's composite primary key; any
    other pair is a one-column key. A pair touching a left-out table is dropped.
    """
    unique = list(dict.fromkeys((int(child), int(parent)) for child, parent in pairs))
    unique = [(c, p) for c, p in unique if columns[c][0] in kept and columns[p][0] in kept]
    result: dict[int, list[ForeignKey]] = {}
    i = 0
    while i < len(unique):
        group = unique[i : i + _composite_run(unique, i, columns, pk_indices)]
        child_table, parent_table = columns[group[0][0]][0], columns[group[0][1]][0]
        fk = ForeignKey(
            tuple(str(columns[c][1]) for c, _ in group),
            table_names[parent_table],
            tuple(str(columns[p][1]) for _, p in group),
        )
        result.setdefault(child_table, []).append(fk)
        i += len(group)
    return result


def _composite_run(
    pairs: list[tuple[int, int]], start: int, columns: list, pk_indices: dict[int, tuple[int, ...]]
) -> int:
    """How many pairs from `start` form one key: len(parent PK) if they qualify, else 1."""
    child_table, parent_table = columns[pairs[start][0]][0], columns[pairs[start][1]][0]
    parent_pk = pk_indices.get(parent_table, ())
    window = pairs[start : start + len(parent_pk)]
    if len(parent_pk) < 2 or len(window) < len(parent_pk):
        return 1
    same_tables = all(
        columns[c][0] == child_table and columns[p][0] == parent_table for c, p in window
    )
    parents = [p for _, p in window]
    children = [c for c, _ in window]
    if (
        same_tables
        and sorted(parents) == sorted(parent_pk)
        and len(set(children)) == len(children)
    ):
        return len(parent_pk)
    return 1
