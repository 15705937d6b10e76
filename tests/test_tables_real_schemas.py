"""The foreign-key graph on every real schema beside the checkout (Spider, BIRD; json and SQLite)."""

from __future__ import annotations

import pytest

from headstart.paths import default_bird_dir, default_spider_dir
from headstart.schema import Schema, load_spider_tables, load_sqlite_schema
from headstart.tables.fk_graph import FkGraph


def _json_schemas() -> list[Schema]:
    out = []
    for path in (default_spider_dir() / "tables.json", default_bird_dir() / "dev_tables.json"):
        if path.exists():
            out.extend(load_spider_tables(path).values())
    return out


def _sqlite_schemas() -> list[Schema]:
    return [load_sqlite_schema(p) for p in sorted((default_spider_dir() / "database").glob("*/*.sqlite"))]


def _check(schema: Schema) -> FkGraph:
    g = FkGraph.from_schema(schema)
    assert sorted(g.order) == sorted(schema.table_names)
    pos = {t: i for i, t in enumerate(g.order)}
    for e in g.edges:
        assert g.group_of(e.src) == g.group_of(e.dst)
        if e not in g.dropped_edges:
            assert pos[e.src] < pos[e.dst]
    return g


def test_every_json_schema():
    schemas = _json_schemas()
    if not schemas:
        pytest.skip("no Spider/BIRD tables json beside the checkout")
    graphs = {s.db_id: _check(s) for s in schemas}
    if "codebase_community" in graphs:  # BIRD: posts.ParentId -> posts
        assert [(e.src, e.dst) for e in graphs["codebase_community"].self_references] == [("posts", "posts")]


def test_every_sqlite_schema():
    schemas = _sqlite_schemas()
    if not schemas:
        pytest.skip("no Spider databases beside the checkout")
    for s in schemas:
        _check(s)
