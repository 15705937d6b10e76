"""The table-cache benchmark's workload: dev questions in random order, table order shuffled per question.

As in the TableCache paper's setup (section 5.1): questions of Spider dev or
BIRD dev in a seeded random order, each listing *all* its database's tables
in a seeded random order, so two questions on one database rarely share a
prompt prefix past the head. BIRD questions carry their evidence as a hint.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headstart.paths import default_bird_dir, default_spider_dir
from headstart.schema.model import Schema
from headstart.schema.spider_json import load_spider_tables

DATASETS = ("spider-dev", "bird-dev")


@dataclass(frozen=True)
class BenchQuestion:
    """One request of the workload."""

    index: int
    db: str
    question: str
    tables: tuple[str, ...]


def load_schemas(dataset: str) -> dict[str, Schema] | None:
    """Schemas the runtime cannot resolve by name (BIRD), or None (Spider ids resolve themselves)."""
    if dataset == "bird-dev":
        return load_spider_tables(default_bird_dir() / "dev_tables.json")
    return None


def sample_workload(dataset: str, num_questions: int, seed: int,
                    schema_of: Callable[[str], Schema]) -> list[BenchQuestion]:
    """`num_questions` questions in seeded random order, tables shuffled per question.

    Args:
        schema_of: callable db -> Schema, to list each database's tables.
    Raises:
        ValueError: unknown dataset or num_questions < 1.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    if num_questions < 1:
        raise ValueError(f"--questions must be >= 1, got {num_questions}")
    root: Path = default_spider_dir() if dataset == "spider-dev" else default_bird_dir()
    rows = json.loads((root / "dev.json").read_text())
    rng = random.Random(seed)
    picked = rng.sample(rows, min(num_questions, len(rows)))
    out = []
    for i, row in enumerate(picked):
        tables = list(schema_of(row["db_id"]).table_names)
        rng.shuffle(tables)
        question = row["question"]
        if row.get("evidence"):
            question = f"{question} Hint: {row['evidence']}"
        out.append(BenchQuestion(i, row["db_id"], question, tuple(tables)))
    return out
