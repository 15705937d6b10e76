"""The committed stubs in shared/headstart/v1 are exactly what
scripts/gen_protos.py generates from protos/ (regenerate with it when this fails)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stubs_are_fresh(tmp_path):
    gen = _gen_module()
    try:
        fresh = gen.generate(tmp_path)
    except gen.ProtoGenError as exc:
        pytest.fail(f"cannot regenerate: {exc}")
    committed_dir = ROOT / "shared" / "headstart" / "v1"
    committed = sorted(p.name for p in committed_dir.iterdir() if p.is_file())
    assert [p.name for p in fresh] == committed
    stale = [p.name for p in fresh if p.read_bytes() != (committed_dir / p.name).read_bytes()]
    assert stale == [], f"stale stubs {stale}: run `python scripts/gen_protos.py`"


@pytest.mark.parametrize("module, service", [
    ("headstart.v1.headstart_pb2", "Headstart"),
    ("headstart.v1.engine_pb2", "Engine"),
])
def test_services_declared(module, service):
    mod = importlib.import_module(module)
    assert service in mod.DESCRIPTOR.services_by_name
