"""What a replica does not import (issue 32: its RSS bar, 1.5 x the GGUF plus the KV budget).

psycopg (9 MiB) loads with the first PostgreSQL schema or DSN error, not with the engine;
transformers' modelling stack (~88 MiB) only for a Hugging Face forward, never to serve a
GGUF model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headstart.kernels import cpu_isa

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


_GGUF_PROBE = """
import sys
from headstart.models import load_model
from headstart.engine.runner.model_runner import ModelRunner
runner = ModelRunner(load_model(sys.argv[1]).model, fast_path="auto")
state = runner.prefill([151644, 8948, 198, 2610, 525, 264])
runner.extend(state, [11])
heavy = sorted(m for m in ("transformers.modeling_utils", "torch._dynamo", "sympy") if m in sys.modules)
assert not heavy, f"serving a GGUF model imported {heavy}"
runner.model(input_ids=__import__("torch").tensor([[151644, 8948]]))  # a Hugging Face forward on demand
assert "transformers.modeling_utils" in sys.modules
"""


def _passed(*names: str) -> dict[str, str]:
    """These variables of the test's environment, where set (where ../shared and the run dir are)."""
    return {name: os.environ[name] for name in names if name in os.environ}


@pytest.mark.skipif(not cpu_isa.supported(), reason="no x86-64 AVX2 CPU: a GGUF model is served quantized only there")
def test_serving_a_gguf_model_imports_no_modeling_code(tmp_path):
    """A GGUF model is served without transformers' modeling stack (~88 MiB of a replica's
    RSS: torch._dynamo, sympy, ...), which it imports only for a Hugging Face forward."""
    from tests.gguf_builder import write_tiny_qwen2

    path = write_tiny_qwen2(tmp_path / "tiny.gguf")
    run = subprocess.run([sys.executable, "-c", _GGUF_PROBE, str(path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}", "PATH": "/usr/bin:/bin",
                                           "HOME": str(tmp_path), **_passed("HEADSTART_SHARED", "HEADSTART_HOME")})
    assert run.returncode == 0, run.stderr[-2000:]
