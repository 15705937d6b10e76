"""The foreign-key graph of a schema: which tables are encoded together, in which order.

The table cache encodes each group (`groups`) together, but in schema order,
not in the topological order given here (`layout` says why); `order` and
`parents` remain the graph's own view.

Nodes are the schema's tables. For every foreign key of table B that
references table A there is one edge A -> B (referenced -> referencing), so a
topological order puts a referenced table before the tables that point at it,
and the later tables of a jointly encoded group attend to the earlier ones.

Awkward schemas, and what happens to them:

- Self-references (`employee.manager_id -> employee`): not an ordering edge,
  reported in `self_references`.
- Composite keys: one `ForeignKey` with several columns, one edge.
- Several foreign keys between the same two tables: one edge that lists them.
- Tables without keys: a group of their own.
- Foreign keys to a table the schema lacks: no edge, reported in `dangling`.
- Table names differing only in case (`Orders` vs `orders`) are resolved
  case-insensitively, as SQLite does; two tables equal up to case are an error.
- Cycles: broken by one rule, deterministic for a given schema. A depth-first
  search starts from each unvisited table in schema order and follows
  out-edges in schema order of their target; an edge that reaches a table
  still on the search stack (a back edge) closes a cycle and is dropped from
  the ordering. Removing every back edge of a DFS leaves an acyclic graph.
  Dropped edges are listed in `dropped_edges`; they still join their tables
  into one group.

Groups are the weakly connected components, ordered by their first table in
schema order; inside a group the order is Kahn's algorithm with ties broken
by schema order.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

from headstart.schema.model import ForeignKey, Schema

log = logging.getLogger(__name__)


class FkGraphError(ValueError):
    """The schema cannot be turned into a graph (duplicate table names)."""


@dataclass(frozen=True)
class FkEdge:
    """`dst` has foreign keys into `src`: `src` is encoded before `dst`."""

    src: str
    dst: str
    foreign_keys: tuple[ForeignKey, ...]


@dataclass(frozen=True)
class DanglingForeignKey:
    """A foreign key of `table` to a table the schema does not have."""

    table: str
    foreign_key: ForeignKey


@dataclass(frozen=True)
class TableGroup:
    """One weakly connected component, its tables in topological order."""

    index: int
    tables: tuple[str, ...]


@dataclass(frozen=True)
class FkGraph:
    """See module docstring. Build with `FkGraph.from_schema(schema)`."""

    db_id: str
    nodes: tuple[str, ...]
    edges: tuple[FkEdge, ...]
    self_references: tuple[FkEdge, ...]
    dropped_edges: tuple[FkEdge, ...]
    dangling: tuple[DanglingForeignKey, ...]
    groups: tuple[TableGroup, ...]

    @classmethod
    def from_schema(cls, schema: Schema) -> "FkGraph":
        """Build the graph, break cycles and order every group.

        Raises:
            FkGraphError: two tables have the same name up to case.
        """
        nodes = tuple(t.name for t in schema.tables)
        index = _index_of(nodes, schema.db_id)
        edges, self_refs, dangling = _collect_edges(schema, index)
        dropped = _back_edges(nodes, edges, index)
        for e in dropped:
            log.warning("%s: foreign-key cycle broken by dropping %s -> %s", schema.db_id, e.src, e.dst)
        kept = [e for e in edges if e not in dropped]
        groups = _order_groups(nodes, edges, kept, index)
        return cls(schema.db_id, nodes, tuple(edges), tuple(self_refs), tuple(dropped), tuple(dangling), groups)

    @property
    def order(self) -> tuple[str, ...]:
        """Every table: the groups one after the other, each in topological order."""
        return tuple(t for g in self.groups for t in g.tables)

    def group_of(self, table: str) -> TableGroup:
        """The group holding `table` (case-insensitive).

        Raises:
            KeyError: no such table.
        """
        for g in self.groups:
            for t in g.tables:
                if t.lower() == table.lower():
                    return g
        raise KeyError(f"{self.db_id}: no table {table!r}; tables: {list(self.nodes)}")

    def parents(self, table: str) -> tuple[str, ...]:
        """Tables `table` references through edges kept for ordering, in schema order."""
        return tuple(e.src for e in self.edges if e.dst == table and e not in self.dropped_edges)


def _index_of(nodes: tuple[str, ...], db_id: str) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, name in enumerate(nodes):
        if name.lower() in index:
            raise FkGraphError(f"{db_id}: tables {nodes[index[name.lower()]]!r} and {name!r} collide (case)")
        index[name.lower()] = i
    return index


def _collect_edges(
    schema: Schema, index: dict[str, int]
) -> tuple[list[FkEdge], list[FkEdge], list[DanglingForeignKey]]:
    """Edges in schema order of the referencing table, then of its first foreign key."""
    nodes = [t.name for t in schema.tables]
    edges: list[FkEdge] = []
    self_refs: list[FkEdge] = []
    dangling: list[DanglingForeignKey] = []
    for table in schema.tables:
        by_src: dict[str, list[ForeignKey]] = {}
        for fk in table.foreign_keys:
            i = index.get(fk.ref_table.lower())
            if i is None:
                dangling.append(DanglingForeignKey(table.name, fk))
                continue
            by_src.setdefault(nodes[i], []).append(fk)
        for src, fks in by_src.items():
            edge = FkEdge(src, table.name, tuple(fks))
            (self_refs if src == table.name else edges).append(edge)
    return edges, self_refs, dangling


def _back_edges(nodes: tuple[str, ...], edges: list[FkEdge], index: dict[str, int]) -> list[FkEdge]:
    """Back edges of an iterative DFS from each table in schema order (see module doc)."""
    out: dict[str, list[FkEdge]] = {n: [] for n in nodes}
    for e in edges:
        out[e.src].append(e)
    for n in nodes:
        out[n].sort(key=lambda e: index[e.dst.lower()])
    white, gray, black = 0, 1, 2
    color = {n: white for n in nodes}
    dropped: list[FkEdge] = []
    for root in nodes:
        if color[root] != white:
            continue
        color[root] = gray
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, i = stack[-1]
            if i == len(out[node]):
                color[node] = black
                stack.pop()
                continue
            stack[-1] = (node, i + 1)
            edge = out[node][i]
            if color[edge.dst] == gray:
                dropped.append(edge)
            elif color[edge.dst] == white:
                color[edge.dst] = gray
                stack.append((edge.dst, 0))
    return sorted(dropped, key=lambda e: (index[e.dst.lower()], index[e.src.lower()]))


def _order_groups(
    nodes: tuple[str, ...], all_edges: list[FkEdge], kept: list[FkEdge], index: dict[str, int]
) -> tuple[TableGroup, ...]:
    """Weakly connected components (over all edges) each in Kahn order (over kept edges)."""
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for e in all_edges:
        a, b = find(index[e.src.lower()]), find(index[e.dst.lower()])
        if a != b:
            parent[max(a, b)] = min(a, b)  # the root is the component's first table
    members: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        members.setdefault(find(i), []).append(i)
    indegree = [0] * len(nodes)
    succ: list[list[int]] = [[] for _ in nodes]
    for e in kept:
        s, d = index[e.src.lower()], index[e.dst.lower()]
        succ[s].append(d)
        indegree[d] += 1
    groups = []
    for gi, root in enumerate(sorted(members)):
        heap = [i for i in members[root] if indegree[i] == 0]
        heapq.heapify(heap)
        order: list[str] = []
        while heap:
            i = heapq.heappop(heap)
            order.append(nodes[i])
            for d in succ[i]:
                indegree[d] -= 1
                if indegree[d] == 0:
                    heapq.heappush(heap, d)
        if len(order) != len(members[root]):  # unreachable: back edges were removed
            raise FkGraphError(f"cycle left in group of {nodes[root]!r} after dropping back edges")
        groups.append(TableGroup(gi, tuple(order)))
    return tuple(groups)
