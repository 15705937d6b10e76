"""Import cycles among the modules of a package tree, function-level imports
included (the logic of ../shared/hooks/import_cycles.py, as a library for
tests/test_import_cycles.py). `cycles(root, package, depth)` returns each
strongly connected component of more than one module; with `depth`, module
names are cut to their first `depth` parts (2: the subpackages of headstart).
"""
import ast
import sys
from pathlib import Path


def modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in (root / package).rglob("*.py"):
        if "_pb2" in path.name:
            continue
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                head = base[: len(base) - (node.level - 1)]
                mod = ".".join(head + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            # the deepest known module named by the import
            parts = t.split(".")
            for i in range(len(parts), 0, -1):
                cand = ".".join(parts[:i])
                if cand in known:
                    if cand != name:
                        found.add(cand)
                    break
    return found


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def cycles(root: Path, package: str, depth: int | None = None) -> list[list[str]]:
    mods = modules(root, package)
    known = set(mods)
    graph = {m: imports_of(m, p, known) for m, p in mods.items()}
    # a package's __init__ importing its own submodules is not a design cycle
    for m in graph:
        graph[m] = {t for t in graph[m] if not (mods[m].name == "__init__.py" and t.startswith(m + "."))
                    and not (mods.get(t) and mods[t].name == "__init__.py" and m.startswith(t + "."))}
    if depth is not None:
        def cut(m):
            return ".".join(m.split(".")[:depth])
        collapsed = {}
        for m, ts in graph.items():
            collapsed.setdefault(cut(m), set()).update(cut(t) for t in ts if cut(t) != cut(m))
        for ts in list(collapsed.values()):
            for t in ts:
                collapsed.setdefault(t, set())
        graph = collapsed
    return sccs(graph)
