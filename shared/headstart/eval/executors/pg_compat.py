"""Give SQLite-flavoured SQL SQLite's meaning on PostgreSQL, where the types allow.

Spider's SQL leans on SQLite behaviour PostgreSQL rejects or reads otherwise.
With the migrated column types (sqlglot qualifies columns and infers types),
this pass rewrites, in SQLite's own terms:
- comparison of a TEXT value with a numeric literal: the literal becomes text
  (SQLite applies TEXT affinity to it: `year = 2014` compares '2014');
- equality / IN between TEXT and numeric expressions: both compare as text
  (SQLite converts the TEXT side to a number, which equals when the text is
  the number's canonical spelling, as in Spider); `<`, `>` cast TEXT to a number;
- AVG / SUM over TEXT: numeric-looking text as a number, other text as 0;
- LIKE over a non-text value (a timestamp): the value as text;
- a column neither grouped nor aggregated in a GROUP BY query (or beside an
  aggregate without GROUP BY): MIN(column).
  NOTE: SQLite returns the value of an arbitrary row of the group (of the
  max/min row when the query has one MAX/MIN). In Spider such columns are
  almost always functionally dependent on the group, so MIN is that value;
  where not, PostgreSQL's answer can differ from SQLite's.
Anything sqlglot cannot qualify is returned untouched (PostgreSQL reports it).
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

_TEXT = exp.DataType.TEXT_TYPES
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_ORDERING = (exp.GT, exp.GTE, exp.LT, exp.LTE)
_NUMBER_PATTERN = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"

# PostgreSQL type names (as the migration writes them) → sqlglot's.
_SQLGLOT_TYPES = {"integer": "INT", "bigint": "BIGINT", "double precision": "DOUBLE", "boolean": "BOOLEAN",
                  "timestamp": "TIMESTAMP", "bytea": "VARBINARY", "text": "TEXT"}


def sqlglot_schema(column_types: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """{table: {column: pg type}} → the same with sqlglot type names."""
    def convert(pg_type: str) -> str:
        if pg_type.startswith(("varchar", "character")):
            return "TEXT"
        if pg_type.startswith("numeric"):
            return "DECIMAL"
        if pg_type.startswith("timestamp"):
            return "TIMESTAMP"
        return _SQLGLOT_TYPES.get(pg_type, "TEXT")

    return {t: {c: convert(ty) for c, ty in cols.items()} for t, cols in column_types.items()}


def apply_sqlite_semantics(tree: exp.Expression, schema: dict[str, dict[str, str]]) -> exp.Expression:
    """The rewritten tree (see the module docstring); `tree` itself when qualification fails."""
    try:
        typed = annotate_types(
            qualify(tree.copy(), schema=schema, dialect="sqlite", quote_identifiers=False,
                    expand_stars=False, validate_qualify_columns=False),
            schema=schema,
        )
    except (SqlglotError, KeyError, ValueError):
        return tree
    for node in list(typed.find_all(*_COMPARISONS)):
        _fix_comparison(node)
    for node in list(typed.find_all(exp.In)):
        _fix_in(node)
    for node in list(typed.find_all(exp.Avg, exp.Sum)):
        if _is_text(node.this):
            node.set("this", _text_as_number(node.this))
    for node in list(typed.find_all(exp.Like)):
        if node.this.type is not None and not _is_text(node.this) and not node.this.is_type(exp.DataType.Type.UNKNOWN):
            node.set("this", exp.cast(node.this, "TEXT"))
    for select in list(typed.find_all(exp.Select)):
        _aggregate_bare_columns(select)
    return typed


def _is_text(node: exp.Expression) -> bool:
    return node.type is not None and node.type.this in _TEXT


def _is_number(node: exp.Expression) -> bool:
    return node.type is not None and node.type.is_type(*exp.DataType.NUMERIC_TYPES)


def _fix_comparison(node: exp.Binary) -> None:
    left, right = node.left, node.right
    for text_side, other in ((left, right), (right, left)):
        if not (_is_text(text_side) and _is_number(other)):
            continue
        if isinstance(other, exp.Literal) or (isinstance(other, exp.Neg) and isinstance(other.this, exp.Literal)):
            other.replace(exp.Literal.string(other.sql()))
        elif isinstance(node, _ORDERING):
            text_side.replace(exp.cast(text_side.copy(), "DOUBLE"))
        else:
            other.replace(exp.cast(other.copy(), "TEXT"))
        return


def _fix_in(node: exp.In) -> None:
    query = node.args.get("query")
    if query is not None:
        select = query.this if isinstance(query, exp.Subquery) else query
        projections = getattr(select, "expressions", [])
        if isinstance(select, exp.Select) and len(projections) == 1:
            inner = projections[0].this if isinstance(projections[0], exp.Alias) else projections[0]
            if _is_text(node.this) != _is_text(inner) and (_is_number(node.this) or _is_number(inner)):
                node.set("this", exp.cast(node.this.copy(), "TEXT"))
                inner.replace(exp.cast(inner.copy(), "TEXT"))
        return
    if _is_text(node.this):
        for value in node.expressions:
            if isinstance(value, exp.Literal) and not value.is_string:
                value.replace(exp.Literal.string(value.this))


def _text_as_number(node: exp.Expression) -> exp.Expression:
    """SQLite's number-from-text in AVG/SUM: numeric-looking text as a number, other text as 0."""
    text = exp.cast(node.copy(), "TEXT")
    matches = exp.RegexpLike(this=text, expression=exp.Literal.string(_NUMBER_PATTERN))
    number = exp.cast(node.copy(), "DOUBLE")
    return exp.Case(ifs=[exp.If(this=matches, true=number)], default=exp.Literal.number(0))


def _aggregate_bare_columns(select: exp.Select) -> None:
    group = select.args.get("group")
    aggregated = any(
        not _inside(agg, exp.Select, select) for p in select.expressions for agg in p.find_all(exp.AggFunc)
    )
    if not group and not aggregated:
        return
    grouped = {g.sql() for g in group.expressions} if group else set()
    aliases = {p.alias for p in select.expressions if p.alias}
    places = list(select.expressions)
    for key in ("having", "order"):
        if select.args.get(key) is not None:
            places.append(select.args[key])
    for place in places:
        for column in list(place.find_all(exp.Column)):
            if column.sql() in grouped or (not column.table and column.name in aliases):
                continue
            if any(_inside(column, kind, select) for kind in (exp.AggFunc, exp.Select, exp.Window)):
                continue
            column.replace(exp.Min(this=column.copy()))


def _inside(node: exp.Expression, kind: type, stop: exp.Expression) -> bool:
    """True when an ancestor of `node` below `stop` is a `kind`."""
    parent = node.parent
    while parent is not None and parent is not stop:
        if isinstance(parent, kind):
            return True
        parent = parent.parent
    return False
