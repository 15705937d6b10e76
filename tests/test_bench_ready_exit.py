"""`bench/ready_exit.py`'s parts: what "right" means for a one-token exit,
the emptied Spider copy its rows stream from, and the table by threshold.
(The run itself, on random:tiny: tests/test_cli.py.)"""

from __future__ import annotations

import sqlite3

import pytest

from bench.ready_exit import as_declared, by_threshold, empty_copy, score
from headstart.paths import default_spider_dir
from headstart.schema.model import Column, Schema, Table

FENCE, SELECT = 11, 22  # token ids: only their equality matters


@pytest.mark.parametrize("exit_text, full_text, sql, tokens, result, expect", [
    # a trained model's ready token opens the answer: a prefix, never the answer
    ("```", "```sql\nSELECT count(*) FROM singer\n```", "SELECT count(*) FROM singer", [FENCE, SELECT], [(6,)],
     dict(first=True, same_text=False, same_sql=False, same_result=False, right=False)),
    ("SELECT", "SELECT count(*) FROM singer", "SELECT count(*) FROM singer", [SELECT], [(6,)],
     dict(first=False, same_text=False, same_sql=False, same_result=False, right=False)),
    # the model would have said only that word
    ("Yes", "Yes", "Yes", [FENCE], None,
     dict(first=True, same_text=True, same_sql=True, same_result=False, right=True)),
    # the word names the full answer's one-cell result
    (" 6", "SELECT count(*) FROM singer", "SELECT count(*) FROM singer", [SELECT], [(6,)],
     dict(first=False, same_text=False, same_sql=False, same_result=True, right=True)),
    ("Yes", "SELECT Capacity > 5000 FROM stadium", "SELECT Capacity > 5000 FROM stadium", [SELECT], [(1,)],
     dict(first=False, same_text=False, same_sql=False, same_result=True, right=True)),
    ("no", "SELECT ...", "SELECT ...", [SELECT], [(0,)],
     dict(first=False, same_text=False, same_sql=False, same_result=True, right=True)),
    ("No", "SELECT ...", "SELECT ...", [SELECT], [(3960,)],
     dict(first=False, same_text=False, same_sql=False, same_result=False, right=False)),
    ("yes", "SELECT ...", "SELECT ...", [SELECT], [("Yes",)],
     dict(first=False, same_text=False, same_sql=False, same_result=True, right=True)),
    # not one cell, or no result (the SQL did not run): nothing to name
    ("6", "SELECT ...", "SELECT ...", [SELECT], [(6, 1)],
     dict(first=False, same_text=False, same_sql=False, same_result=False, right=False)),
    ("6", "SELECT ...", "SELECT ...", [SELECT], [(6,), (6,)],
     dict(first=False, same_text=False, same_sql=False, same_result=False, right=False)),
    ("6", "SELECT ...", "SELECT ...", [SELECT], None,
     dict(first=False, same_text=False, same_sql=False, same_result=False, right=False)),
])
def test_right_means_the_same_text_sql_or_one_cell_result(exit_text, full_text, sql, tokens, result, expect):
    assert score(exit_text, FENCE, full_text, sql, tokens, result) == expect


def test_the_rows_stream_from_an_emptied_copy(tmp_path):
    source = default_spider_dir() / "database" / "concert_singer" / "concert_singer.sqlite"
    path, rows = empty_copy(source, tmp_path)
    conn = sqlite3.connect(path)
    try:
        for table in ("stadium", "singer", "concert", "singer_in_concert"):
            assert conn.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (0,)
    finally:
        conn.close()
    counts = {}
    for row in rows:
        counts[row["table"]] = counts.get(row["table"], 0) + 1
    assert counts == {"stadium": 9, "singer": 6, "concert": 6, "singer_in_concert": 10}
    assert [r["table"] for r in rows][:10] == ["stadium"] * 9 + ["singer"]  # table order, then rowid order


def _point(gap, stop=False, in_vocabulary=False, right=(False, False), first=(True, True)):
    return dict(gap=gap, stop=stop, in_vocabulary=in_vocabulary,
                answers=[dict(right=r, first=f) for r, f in zip(right, first)])


def test_the_table_by_threshold_counts_what_would_fire():
    points = [_point(0.4), _point(1.5), _point(5.0, stop=True), _point(9.0, in_vocabulary=True, right=(True, False))]
    rows = {r["tau"]: r for r in by_threshold(points, (0.5, 1.0, 2.0, 8.0))}
    assert [rows[t]["clear"] for t in (0.5, 1.0, 2.0, 8.0)] == [3, 3, 2, 1]  # a stop token clears, never fires
    assert [rows[t]["fires"] for t in (0.5, 1.0, 2.0, 8.0)] == [4, 4, 2, 2]
    assert rows[0.5] == dict(tau=0.5, positions=4, clear=3, queries=8, fires=4, right=1, first_token=4,
                             fires_in_v=2, right_in_v=1)


def test_spider_values_are_kept_in_their_declared_types():
    table = Table("singer", (Column("id", "int"), Column("name", "text"), Column("age", "real"),
                             Column("is_male", "bool"), Column("year", "text"), Column("born", "date")))
    schema = Schema("concert_singer", (table,))
    raw = {"table": "singer", "values": {"id": "7", "name": 12, "age": "52.5", "is_male": "F", "year": 2008,
                                         "born": "1970-01-02"}}
    assert as_declared(schema, raw) == {"table": "singer", "values": {
        "id": 7, "name": "12", "age": 52.5, "year": "2008", "born": "1970-01-02"}}  # 'F' is no number: NULL
    assert as_declared(schema, {"table": "singer", "values": {"id": 2.5}})["values"] == {}
