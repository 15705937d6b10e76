"""No import cycles in shared/headstart, function-level imports included."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import cycles

ROOT = Path(__file__).resolve().parents[1] / "shared"


def test_no_module_import_cycles():
    assert cycles(ROOT, "headstart") == []


def test_no_subpackage_import_cycles():
    """engine <- tables <- build, engine <- replay: the engine knows the table
    cache only as a `PrefixSource` (issue 11)."""
    assert cycles(ROOT, "headstart", depth=2) == []


def test_the_checker_sees_a_function_level_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import pkg.b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    assert cycles(tmp_path, "pkg") == [["pkg.a", "pkg.b"]]
