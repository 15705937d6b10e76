"""Foreign-key graph: edges, groups, topological order and cycle breaking on awkward schemas."""

from __future__ import annotations

import pytest

from headstart.schema.model import Column, ForeignKey, Schema, Table
from headstart.tables.fk_graph import FkGraph, FkGraphError


def T(name: str, *fks: tuple[str, str] | ForeignKey) -> Table:
    """Table `name` with an `id` column and one FK per (column, ref_table) pair."""
    keys = tuple(f if isinstance(f, ForeignKey) else ForeignKey((f[0],), f[1], ("id",)) for f in fks)
    cols = (Column("id", "int"),) + tuple(Column(c, "int") for fk in keys for c in fk.columns)
    return Table(name, cols, ("id",), keys)


def S(*tables: Table) -> Schema:
    return Schema("db", tuple(tables))


# name, schema, groups (topological order each), dropped (src, dst), self refs (src, dst), dangling tables
CASES = [
    ("chain", S(T("a"), T("b", ("a_id", "a")), T("c", ("b_id", "b"))), [("a", "b", "c")], [], [], []),
    ("chain declared backwards", S(T("c", ("b_id", "b")), T("b", ("a_id", "a")), T("a")),
     [("a", "b", "c")], [], [], []),
    ("no keys", S(T("x"), T("y"), T("z")), [("x",), ("y",), ("z",)], [], [], []),
    ("diamond, ties by schema order", S(T("d", ("b_id", "b"), ("c_id", "c")), T("c", ("a_id", "a")),
                                        T("b", ("a_id", "a")), T("a")), [("a", "c", "b", "d")], [], [], []),
    ("self reference", S(T("employee", ("manager_id", "employee")), T("dept")),
     [("employee",), ("dept",)], [], [("employee", "employee")], []),
    ("self reference in a chain", S(T("dept"), T("employee", ("dept_id", "dept"), ("boss_id", "employee"))),
     [("dept", "employee")], [], [("employee", "employee")], []),
    ("composite key", S(T("orders"), T("items", ForeignKey(("order_id", "line"), "orders", ("id", "line")))),
     [("orders", "items")], [], [], []),
    ("two keys to one table", S(T("flight", ("origin", "airport"), ("dest", "airport")), T("airport")),
     [("airport", "flight")], [], [], []),
    ("2-cycle", S(T("a", ("b_id", "b")), T("b", ("a_id", "a"))), [("a", "b")], [("b", "a")], [], []),
    ("3-cycle", S(T("a", ("c_id", "c")), T("b", ("a_id", "a")), T("c", ("b_id", "b"))),
     [("a", "b", "c")], [("c", "a")], [], []),
    ("3-cycle from another start", S(T("b", ("a_id", "a")), T("c", ("b_id", "b")), T("a", ("c_id", "c"))),
     [("b", "c", "a")], [("a", "b")], [], []),
    ("two cycles sharing a table",
     S(T("a", ("b_id", "b"), ("c_id", "c")), T("b", ("a_id", "a")), T("c", ("a_id", "a"))),
     [("a", "b", "c")], [("b", "a"), ("c", "a")], [], []),
    ("cycle with a tail",
     S(T("root"), T("p", ("root_id", "root"), ("q_id", "q")), T("q", ("p_id", "p")), T("leaf", ("q_id", "q"))),
     [("root", "p", "q", "leaf")], [("q", "p")], [], []),
    ("dangling reference", S(T("t", ("gone_id", "missing")), T("u")), [("t",), ("u",)], [], [], ["t"]),
    ("names differ in case", S(T("Orders"), T("items", ("order_id", "orders"))), [("Orders", "items")], [], [], []),
    ("components ordered by first table",
     S(T("z", ("y_id", "y")), T("lonely"), T("y"), T("w", ("lonely_id", "lonely"))),
     [("y", "z"), ("lonely", "w")], [], [], []),
    ("empty schema", S(), [], [], [], []),
]


@pytest.mark.parametrize(
    ("name", "schema", "groups", "dropped", "self_refs", "dangling"), CASES, ids=[c[0] for c in CASES]
)
def test_graph(name, schema, groups, dropped, self_refs, dangling):
    g = FkGraph.from_schema(schema)
    assert [grp.tables for grp in g.groups] == groups
    assert [grp.index for grp in g.groups] == list(range(len(groups)))
    assert [(e.src, e.dst) for e in g.dropped_edges] == dropped
    assert [(e.src, e.dst) for e in g.self_references] == self_refs
    assert [d.table for d in g.dangling] == dangling
    assert g.order == tuple(t for grp in groups for t in grp)
    assert FkGraph.from_schema(schema) == g  # deterministic


def test_edges_point_from_referenced_to_referencing_and_keep_their_keys():
    composite = ForeignKey(("order_id", "line"), "orders", ("id", "line"))
    flight = T("flight", ("o", "airport"), ("d", "airport"))
    g = FkGraph.from_schema(S(T("orders"), T("items", composite), flight, T("airport")))
    assert [(e.src, e.dst, e.foreign_keys) for e in g.edges] == [
        ("orders", "items", (composite,)),
        ("airport", "flight", (ForeignKey(("o",), "airport", ("id",)), ForeignKey(("d",), "airport", ("id",)))),
    ]


def test_every_kept_edge_goes_forward_in_the_order():
    g = FkGraph.from_schema(
        S(T("a", ("c_id", "c")), T("b", ("a_id", "a")), T("c", ("b_id", "b")), T("d", ("a_id", "a")))
    )
    pos = {t: i for i, t in enumerate(g.order)}
    kept = [e for e in g.edges if e not in g.dropped_edges]
    assert [(e.src, e.dst) for e in kept] == [("a", "b"), ("b", "c"), ("a", "d")]
    assert all(pos[e.src] < pos[e.dst] for e in kept)


@pytest.mark.parametrize(
    ("table", "group", "parents"), [("a", 0, ()), ("B", 0, ("a",)), ("c", 0, ("b",)), ("x", 1, ())]
)
def test_group_of_and_parents(table, group, parents):
    g = FkGraph.from_schema(S(T("a"), T("b", ("a_id", "a")), T("c", ("b_id", "b"), ("c_id", "c")), T("x")))
    assert g.group_of(table).index == group
    assert g.parents(table.lower()) == parents


def test_unknown_table_and_case_collision():
    g = FkGraph.from_schema(S(T("a")))
    with pytest.raises(KeyError, match="no table 'nope'"):
        g.group_of("nope")
    with pytest.raises(FkGraphError, match="collide"):
        FkGraph.from_schema(S(T("Users"), T("users")))
