"""torch's OpenMP helpers sleep between parallel regions (`headstart/__init__.py`).

GNU OpenMP reads OMP_WAIT_POLICY once, when torch loads it; so the variable
must be set before any entry point imports torch, and a user's own value
must win.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_ORDER_PROBE = """
import importlib, os, sys
importlib.import_module(sys.argv[1])
mods = list(sys.modules)  # in import order
assert "torch" in mods, "this entry point does not load torch: nothing to check"
assert mods.index("headstart") < mods.index("torch"), f"torch loaded before headstart: {mods.index('torch')}"
print(os.environ["OMP_WAIT_POLICY"])
"""


def _run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}", "PATH": "/usr/bin:/bin", **env})


@pytest.mark.parametrize("entry", ["cli.app", "services.engine.deployment", "bench.ttft", "bench.serve"])
def test_every_entry_point_sets_the_policy_before_torch_loads(entry):
    run = _run(_ORDER_PROBE, entry)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "PASSIVE"


def test_a_policy_the_user_set_is_kept():
    run = _run("import os, headstart; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ACTIVE"
