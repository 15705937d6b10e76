"""No import cycles in shared/headstart, function-level imports included."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import cycles

ROOT = Path(__file__).resolve().parents[1] / "shared"

# Known debt, to be removed, never grown: the runtime (in engine) builds the
# table cache and replays typed traces, and tables and replay use the engine.
# The fix is the prefix-source interface of issue 11 (not yet done).
KNOWN_SUBPACKAGE_CYCLES = [["headstart.engine", "headstart.replay", "headstart.tables"]]


def test_no_module_import_cycles():
    assert cycles(ROOT, "headstart") == []


def test_no_new_subpackage_import_cycles():
    found = cycles(ROOT, "headstart", depth=2)
    for cycle in found:
        assert any(set(cycle) <= set(known) for known in KNOWN_SUBPACKAGE_CYCLES), f"new import cycle: {cycle}"


def test_the_checker_sees_a_function_level_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import pkg.b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    assert cycles(tmp_path, "pkg") == [["pkg.a", "pkg.b"]]
