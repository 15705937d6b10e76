"""The engine's layout holds: its parts layered as docs/architecture.md draws them, files of a
readable size, and no module reaching into another package's private names.

- Layers: inside `headstart.engine`, a module imports only its own part and the parts below it:
  kv < runner < sched < requests < sessions < the top files (`prefix_source`, `runtime`);
  `errors` and `states` sit under all of them. Imports inside functions count too.
- Size: no engine file over MAX_LINES lines (one job a file; STYLE.md).
- Private names: no module of the library, the services, the benchmarks, the load tests or the
  command imports a `_name` from a module of another package (a package's private names are
  its own business; tests may reach them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "shared" / "headstart" / "engine"
MAX_LINES = 420  # "about 400": a file past it has more than one job

# the engine's parts, bottom first; a module may import its own part and those before it
LAYERS = ["base", "kv", "runner", "sched", "requests", "sessions", "top"]
BASE = {"errors", "states"}
TOP = {"prefix_source", "runtime"}

# (importing module, imported module, name): allowed anyway, with the reason. Keep it empty.
ALLOWED_PRIVATE: dict[tuple[str, str, str], str] = {}

SOURCES = [ROOT / "shared" / "headstart", ROOT / "services", ROOT / "bench", ROOT / "loadtest", ROOT / "cli"]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "shared" if path.is_relative_to(ROOT / "shared") else ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def engine_part(module: str) -> str | None:
    """The layer of a `headstart.engine` module, None outside the engine."""
    parts = module.split(".")
    if parts[:2] != ["headstart", "engine"] or len(parts) < 3:
        return None
    head = parts[2]
    if head in BASE:
        return "base"
    if head in TOP:
        return "top"
    if head in LAYERS:
        return head
    raise AssertionError(f"{module}: an engine module outside the parts docs/architecture.md draws")


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names imported from it, line) of every import statement, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names], node.lineno))
    return found


def library_files() -> list[Path]:
    files = []
    for source in SOURCES:
        files.extend(p for p in source.rglob("*.py") if "_pb2" not in p.name)
    return sorted(files)


def test_engine_files_are_a_readable_size():
    long = {str(p.relative_to(ROOT)): n for p in ENGINE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"engine files over {MAX_LINES} lines (split them by job): {long}"


def test_engine_parts_import_only_downward():
    wrong = []
    for path in sorted(ENGINE.rglob("*.py")):
        module = module_name(path)
        own = engine_part(module)
        for imported, names, line in imports(path):
            targets = [imported] if imported != "headstart.engine" else [f"headstart.engine.{n}" for n in names]
            for target in targets:
                part = engine_part(target)
                if part is not None and own is not None and LAYERS.index(part) > LAYERS.index(own):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {target} ({part})")
    assert not wrong, "an engine part imports a part above it:\n" + "\n".join(wrong)


def test_no_private_name_is_imported_across_packages():
    reaches = []
    for path in library_files():
        module = module_name(path)
        package = package_of(module, path)
        for imported, names, line in imports(path):
            if imported.rpartition(".")[0] == package or imported == package:
                continue  # its own package
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    if (module, imported, name) not in ALLOWED_PRIVATE:
                        reaches.append(f"{path.relative_to(ROOT)}:{line}: from {imported} import {name}")
    assert not reaches, "private names imported from another package (make them public, or move the code):\n" \
        + "\n".join(reaches)


@pytest.mark.parametrize("source, expected", [
    ("from headstart.engine.sched.worker import _commit\n", True),
    ("from headstart.engine.sched.worker import ForwardWorker\n", False),
    ("from google.protobuf import descriptor as _descriptor\n", False),
    ("def f():\n    from headstart.kv import _secret\n", True),
    ("from __future__ import annotations\n", False),
])
def test_the_private_import_check_sees_what_it_must(tmp_path, source, expected):
    """The scan itself: a private name found at any depth; an alias or a dunder is not one."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    private = [n for _, names, _ in imports(path) for n in names if n.startswith("_") and not n.startswith("__")]
    assert bool(private) == expected
