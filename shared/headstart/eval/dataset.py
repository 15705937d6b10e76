"""Load an evaluation dataset into `EvalQuestion`s.

Three sources, picked by name:
- `spider-dev`: shared/data/spider (dev.json, tables.json, database/<db>/<db>.sqlite);
- `bird-dev`: shared/data/bird (dev.json, dev_tables.json); BIRD databases are
  not shipped, so without `db_dir` every question is skipped with a reason;
- a path to a `.json` file: a list of {question, query, db_id} over SQLite files
  in DB_DIR/<db_id>/<db_id>.sqlite with DB_DIR/tables.json (Spider's layout;
  DB_DIR defaults to the file's folder).

Questions whose database file is missing stay in the list, marked skipped, so a
report can say how many were left out and why (Spider's wta_1 is not shipped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from headstart.eval.errors import ConfigError, DatasetError
from headstart.eval.records import EvalQuestion
from headstart.paths import default_bird_dir, default_spider_dir

DATASET_NAMES = ("spider-dev", "bird-dev")


@dataclass(frozen=True)
class Dataset:
    """Questions to evaluate plus where their schemas and databases live."""

    name: str
    questions: tuple[EvalQuestion, ...]
    db_dir: Path | None
    tables_path: Path | None

    @property
    def num_skipped(self) -> int:
        return sum(q.skipped for q in self.questions)


def load_dataset(
    name: str,
    *,
    db_dir: Path | None = None,
    dbs: list[str] | None = None,
    limit: int | None = None,
) -> Dataset:
    """Load `name` (a dataset name or a FILE.json), then filter by `dbs` and cut to `limit`.

    `limit` counts questions in file order after the `dbs` filter, skipped ones
    included. Raises DatasetError for an unknown name, a malformed file or a
    `dbs` entry that is not in the dataset; ConfigError for a bad limit.
    """
    if limit is not None and limit <= 0:
        raise ConfigError(f"--limit must be a positive number of questions, got {limit}")
    if name == "spider-dev":
        root = default_spider_dir()
        rows = _read_list(root / "dev.json")
        base = Path(db_dir) if db_dir else root / "database"
        tables = root / "tables.json"
        questions = [_spider_row(i, r, base) for i, r in enumerate(rows)]
    elif name == "bird-dev":
        root = default_bird_dir()
        rows = _read_list(root / "dev.json")
        base = Path(db_dir) if db_dir else None
        tables = root / "dev_tables.json"
        questions = [_bird_row(i, r, base) for i, r in enumerate(rows)]
    elif name.endswith(".json"):
        path = Path(name)
        rows = _read_list(path)
        base = Path(db_dir) if db_dir else path.parent
        tables = base / "tables.json"
        questions = [_spider_row(i, r, base) for i, r in enumerate(rows)]
    else:
        raise DatasetError(
            f"unknown dataset {name!r}; valid: {', '.join(DATASET_NAMES)} or a path to FILE.json"
        )
    questions = _filter(questions, dbs, limit)
    return Dataset(name, tuple(questions), base, tables if tables.exists() else None)


def find_database(db_dir: Path, db_id: str) -> Path | None:
    """The SQLite file of `db_id` under `db_dir` (<db>/<db>.sqlite or database/<db>/<db>.sqlite)."""
    for candidate in (db_dir / db_id / f"{db_id}.sqlite", db_dir / "database" / db_id / f"{db_id}.sqlite"):
        if candidate.is_file():
            return candidate
    return None


def _read_list(path: Path) -> list[dict]:
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(rows, list):
        raise DatasetError(f"{path} must hold a JSON list of questions, got {type(rows).__name__}")
    return rows


def _field(row: dict, index: int, *keys: str) -> str:
    if not isinstance(row, dict):
        raise DatasetError(f"question {index} is not an object: {row!r:.80}")
    for key in keys:
        if isinstance(row.get(key), str):
            return row[key]
    raise DatasetError(f"question {index} lacks a string field {' or '.join(map(repr, keys))}")


def _located(index: int, qid: str, db_id: str, base: Path | None, **fields) -> EvalQuestion:
    if base is None:
        path, reason = None, "database not available (BIRD databases are not shipped; pass --db-dir)"
    else:
        path = find_database(base, db_id)
        reason = None if path else f"database file missing: {base / db_id / (db_id + '.sqlite')}"
    return EvalQuestion(index=index, question_id=qid, db_id=db_id, db_path=path, skip_reason=reason, **fields)


def _spider_row(index: int, row: dict, base: Path) -> EvalQuestion:
    return _located(
        index,
        str(row.get("question_id", index)) if isinstance(row, dict) else str(index),
        _field(row, index, "db_id"),
        base,
        question=_field(row, index, "question"),
        gold_sql=_field(row, index, "query", "SQL", "sql"),
    )


def _bird_row(index: int, row: dict, base: Path | None) -> EvalQuestion:
    return _located(
        index,
        str(row.get("question_id", index)) if isinstance(row, dict) else str(index),
        _field(row, index, "db_id"),
        base,
        question=_field(row, index, "question"),
        gold_sql=_field(row, index, "SQL", "sql", "query"),
        evidence=row.get("evidence", "") or "",
        difficulty=row.get("difficulty", "") or "",
    )


def _filter(questions: list[EvalQuestion], dbs: list[str] | None, limit: int | None) -> list[EvalQuestion]:
    if dbs:
        known = {q.db_id for q in questions}
        unknown = sorted(set(dbs) - known)
        if unknown:
            raise DatasetError(f"--dbs {', '.join(unknown)} not in the dataset; available: {', '.join(sorted(known))}")
        wanted = set(dbs)
        questions = [q for q in questions if q.db_id in wanted]
    return questions[:limit] if limit is not None else questions


def seeded_subset(dataset: Dataset, size: int, seed: int) -> Dataset:
    """`size` questions drawn with `random.Random(seed)` (sha-free and stable across processes),
    kept in file order; the whole dataset when it has no more."""
    import dataclasses
    import random

    if size <= 0:
        raise ConfigError(f"--sample must be a positive number of questions, got {size}")
    if size >= len(dataset.questions):
        return dataset
    picked = sorted(random.Random(seed).sample(range(len(dataset.questions)), size))
    return dataclasses.replace(dataset, questions=tuple(dataset.questions[i] for i in picked))
