"""Generate the values table of deploy/helm/headstart/README.md from values.yaml's `# --` comments.

    .venv/bin/python scripts/gen_chart_readme.py          # rewrite the table in the README
    .venv/bin/python scripts/gen_chart_readme.py --check  # exit 1 when the README is stale

Every key of values.yaml carries a `# -- description` comment (continued on
following `#` lines). A documented key whose children are documented too is
a group (each child then needs a comment and gets a row); any other documented key is one row, its
default shown as YAML. The table sits between the two MARKER lines.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "headstart"
BEGIN, END = "<!-- values-table:begin (scripts/gen_chart_readme.py) -->", "<!-- values-table:end -->"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-]+):(\s.*)?$")
_DOC = re.compile(r"^\s*# --\s?(.*)$")
_MORE = re.compile(r"^\s*#\s?(.*)$")


class ValuesDocError(ValueError):
    """A key of values.yaml has no `# --` comment."""


@dataclass(frozen=True)
class KeyLine:
    path: tuple[str, ...]
    indent: int
    doc: str | None
    line: int


def key_lines(text: str) -> list[KeyLine]:
    """Every mapping key of values.yaml (list items' keys excluded) with its doc comment."""
    out: list[KeyLine] = []
    stack: list[tuple[int, str]] = []
    doc: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if m := _DOC.match(line):
            doc = [m.group(1).strip()]
            continue
        if doc is not None and (m := _MORE.match(line)) and line.strip().startswith("#"):
            doc.append(m.group(1).strip())
            continue
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("- "):
            if line.strip() and not line.strip().startswith("#"):
                doc = None
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        out.append(KeyLine(tuple(k for _, k in stack), indent, " ".join(doc) if doc else None, number))
        doc = None
    return out


def rows(text: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) rows, in file order.

    Raises:
        ValuesDocError: a key outside a documented default lacks its comment.
    """
    values = yaml.safe_load(text)
    keys = key_lines(text)
    documented_leaf: list[tuple[str, ...]] = []
    out = []
    for i, key in enumerate(keys):
        if any(key.path[:len(leaf)] == leaf for leaf in documented_leaf):
            continue  # part of a documented key's default
        if key.doc is None:
            raise ValuesDocError(f"values.yaml line {key.line}: key {'.'.join(key.path)} has no '# --' comment")
        children = [k for k in keys[i + 1:] if k.path[:len(key.path)] == key.path and len(k.path) == len(key.path) + 1]
        if any(c.doc is not None for c in children):
            continue  # a group: each child needs its own comment and gets its own row
        documented_leaf.append(key.path)
        value = values
        for part in key.path:
            value = value[part]
        out.append((".".join(key.path), _type(value), _default(value), key.doc))
    return out


def _type(value) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__)


def _default(value) -> str:
    return json.dumps(value, separators=(", ", ": "))


def table(text: str) -> str:
    lines = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for key, kind, default, doc in rows(text):
        lines.append(f"| `{key}` | {kind} | `{default}` | {doc.replace('|', '/')} |")
    return "\n".join(lines)


def render_readme(readme: str, values_text: str) -> str:
    """The README with the table between the markers replaced."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table(values_text) + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the README is current")
    ns = parser.parse_args(argv)
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    fresh = render_readme(readme, (CHART / "values.yaml").read_text())
    if ns.check:
        if fresh != readme:
            print("deploy/helm/headstart/README.md is stale: run scripts/gen_chart_readme.py", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
