"""What a replica imports before it serves a PostgreSQL database: not psycopg (9 MiB of its RSS).

The replica's RSS bar (issue 32: 1.5 x the GGUF plus the KV budget) has little room, so the
PostgreSQL driver loads with the first PostgreSQL schema or DSN error, not with the engine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import sys
import services.engine.deployment, headstart.schema, headstart.schema.catalogue, headstart.build
assert "psycopg" not in sys.modules, "psycopg loaded with the engine"
from headstart.schema.dsn import scrub_password
assert scrub_password("failed: password=hunter22 x", "host=h password=hunter22") == "failed: password=*** x"
assert "psycopg" in sys.modules  # and it still works where it is needed
"""


def test_the_engine_loads_psycopg_only_when_a_dsn_needs_it():
    run = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
