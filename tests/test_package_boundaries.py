"""The library (`shared/headstart`) sits below everything else: none of its modules imports the
packages above it (`services`, `bench`, `loadtest`, the `headstart` command's `cli`) or a server or
plotting package (Ray, FastAPI, uvicorn, matplotlib), so the engine runs where those are missing
(the GPU check's bare image: tests/test_gpu_check.py). `services`, `bench` and `loadtest` do not
import `cli`, the top (docs/architecture.md, "Packages").

Two checks, both over every module under `shared/headstart`:
- the source: every import statement, at any depth (a function's lazy import too), and every
  `importlib.import_module("...")` of a literal name;
- the running interpreter: a fresh process imports every module, and a finder and an `__import__`
  hook record, for every import of a forbidden package (loaded already or not), the innermost
  `headstart` module on the stack: what a third-party package pulls in on the library's behalf
  counts too.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "shared" / "headstart"

# The layers above the library, and the server and plotting packages the engine must not need.
FORBIDDEN = frozenset({"services", "bench", "loadtest", "cli", "ray", "fastapi", "uvicorn", "matplotlib"})

# (library module, forbidden package) -> why it may import it. Keep it short.
ALLOWED = {
    ("headstart.eval.plots", "matplotlib"):
        "`headstart eval`'s report figure (eval.report, eval.compare_runs); the harness, not the engine",
}

# Modules the runtime check does not import, and why (the source check still reads them).
NOT_IMPORTED = {
    "headstart.eval.__main__": "runs `python -m headstart.eval`'s command when imported",
}

# Run in a fresh interpreter: argv[1] the package to walk. Prints one JSON object.
PROBE = r"""
import builtins, importlib, json, pkgutil, sys, traceback

FORBIDDEN, SKIP = set(json.loads(sys.argv[2])), set(json.loads(sys.argv[3]))
package = sys.argv[1]
loaded_by = {}  # forbidden package -> the modules of `package` that imported it


def note(name, frame):
    # the innermost frame of `package` on the stack imported it (itself, or through a third party)
    top = name.split(".")[0]
    if top not in FORBIDDEN:
        return
    importer = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == package or module.startswith(package + "."):
            importer = module
            break
        frame = frame.f_back
    loaded_by.setdefault(top, set()).add(importer)


class Recorder:
    # first loads, `importlib.import_module` included
    def find_spec(self, name, path=None, target=None):
        note(name, sys._getframe(1))
        return None  # the real finders load it


real_import = builtins.__import__


def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    # every import statement, of a package already loaded too
    if level == 0:
        note(name, sys._getframe(1))
    return real_import(name, globals, locals, fromlist, level)


sys.meta_path.insert(0, Recorder())
builtins.__import__ = recording_import
root = importlib.import_module(package)
names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
failed = {}
for name in names:
    if name in SKIP:
        continue
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps({"file": root.__file__, "modules": names, "failed": failed,
                  "loaded_by": {top: sorted(map(str, who)) for top, who in loaded_by.items()},
                  "in_sys_modules": sorted(m for m in FORBIDDEN if m in sys.modules)}))
"""


def forbidden_imports(source: str, forbidden: frozenset[str] = FORBIDDEN) -> set[str]:
    """The `forbidden` top-level packages a module's source imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        else:
            continue
        found |= {n.split(".")[0] for n in names} & forbidden
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(LIBRARY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def probe(package: str, pythonpath: list[Path]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    done = subprocess.run([sys.executable, "-c", PROBE, package, json.dumps(sorted(FORBIDDEN)),
                           json.dumps(sorted(NOT_IMPORTED))],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("source, expected", [
    ("import ray", {"ray"}),
    ("import ray.serve as serve", {"ray"}),
    ("from services.launcher import serve_command", {"services"}),
    ("def f():\n    from bench.ttft import run_ttft_bench", {"bench"}),  # a lazy import counts
    ("import importlib\nimportlib.import_module('loadtest.run')", {"loadtest"}),
    ("from cli.app import app", {"cli"}),
    ("import matplotlib.pyplot as plt\nimport fastapi, uvicorn", {"matplotlib", "fastapi", "uvicorn"}),
    ("from headstart.eval.cli import eval_cli\nfrom . import cli\nimport rayon", set()),  # not the packages
])
def test_the_source_scan_finds_forbidden_imports(source, expected):
    assert forbidden_imports(source) == expected


def test_no_library_module_imports_a_package_above_it_or_a_server_package():
    files = sorted(LIBRARY.rglob("*.py"))
    assert len(files) > 100
    found = {(module_name(p), pkg) for p in files for pkg in forbidden_imports(p.read_text())}
    assert found - ALLOWED.keys() == set(), "the library imports packages above it (tests/test_package_boundaries.py)"
    assert ALLOWED.keys() <= found, f"stale ALLOWED entries: {sorted(ALLOWED.keys() - found)}"


@pytest.mark.parametrize("layer", ["services", "bench", "loadtest"])
def test_the_layers_below_the_command_do_not_import_it(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files
    assert [str(p.relative_to(ROOT)) for p in files if forbidden_imports(p.read_text(), frozenset({"cli"}))] == []


def test_importing_every_library_module_loads_no_package_above_it():
    report = probe("headstart", [ROOT / "shared", ROOT])
    assert Path(report["file"]).resolve() == LIBRARY / "__init__.py"
    assert len(report["modules"]) > 100 and NOT_IMPORTED.keys() <= set(report["modules"])
    assert report["failed"] == {}
    loaded = {(importer, pkg) for pkg, importers in report["loaded_by"].items() for importer in importers}
    assert loaded - ALLOWED.keys() == set(), "imported by the library (`None`: with no library module on the stack)"
    assert set(report["in_sys_modules"]) == {pkg for _, pkg in loaded}


def test_the_import_probe_names_every_module_that_crossed(tmp_path):
    """The runtime check can fail: both planted modules that import `bench` are named (the second
    finds it loaded), and the one that reaches `loadtest` through another package."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text("import json\n")
    (package / "report.py").write_text("from planted import engine\nimport bench  # the crossing\n")
    (package / "z_late.py").write_text("import bench as again\n")
    (package / "z_via.py").write_text("import third_party\n")
    (tmp_path / "third_party.py").write_text("import importlib\nimportlib.import_module('loadtest')\n")
    report = probe("planted", [tmp_path, ROOT])
    assert report["failed"] == {}
    assert report["loaded_by"] == {"bench": ["planted.report", "planted.z_late"], "loadtest": ["planted.z_via"]}
    assert report["in_sys_modules"] == ["bench", "loadtest"]
