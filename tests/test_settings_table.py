"""The configuration table of docs/configuration.md (scripts/gen_settings_table.py) is current and
names every `HEADSTART_*` variable the code reads."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"HEADSTART_[A-Z0-9_]*[A-Z0-9]")
SCANNED = ("shared", "cli", "services", "bench", "loadtest", "scripts", "tests", "deploy")
SUFFIXES = {".py", ".sh", ".yaml", ".tpl", ".toml"}
# Names in the code that are not environment variables.
NOT_VARIABLES = {"HEADSTART_QUESTION"}  # prompt.py: a placeholder inside the chat template


def _gen():
    spec = importlib.util.spec_from_file_location("gen_settings_table", ROOT / "scripts" / "gen_settings_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _names_in_code() -> set[str]:
    files = [p for d in SCANNED for p in (ROOT / d).rglob("*")
             if p.suffix in SUFFIXES and p.is_file() and p != Path(__file__).resolve()]
    files += [ROOT / "Dockerfile", ROOT / "run.sh"]
    names = set()
    for path in files:
        names |= set(NAME.findall(path.read_text(errors="replace")))
    return names


def test_the_settings_table_is_current():
    gen = _gen()
    readme = (ROOT / "docs" / "configuration.md").read_text()
    assert gen.render_readme(readme) == readme, "run: .venv/bin/python scripts/gen_settings_table.py"


def test_every_headstart_variable_in_the_code_has_a_row():
    gen = _gen()
    rows = {row.name for row in gen.settings_rows() + gen.plain_rows()}
    wildcards = tuple(r[:-1] for r in rows if r.endswith("*"))  # HEADSTART_LOADTEST_*
    bare_prefixes = {_env_prefix(path).rstrip("_") for path, _ in gen.SETTINGS_CLASSES}  # HEADSTART_GATEWAY_
    missing = {n for n in _names_in_code() - rows - NOT_VARIABLES - bare_prefixes if not (n + "_").startswith(wildcards)}
    assert not missing, f"HEADSTART_* names in the code with no row in the settings table: {sorted(missing)}"
    assert len(rows) > 60


def _env_prefix(path: str) -> str:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name).model_config["env_prefix"]


def test_a_field_without_description_is_an_error():
    gen = _gen()

    class Bad(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="HEADSTART_BAD_")
        documented: int = Field(1, description="fine")
        undocumented: int = 2

    with pytest.raises(gen.SettingsDocError, match="undocumented"):
        gen.settings_rows([(Bad, "nobody")])


def test_a_plain_variable_its_file_does_not_read_is_an_error(tmp_path, monkeypatch):
    gen = _gen()
    (tmp_path / "shared/headstart").mkdir(parents=True)
    (tmp_path / "shared/headstart/paths.py").write_text("nothing here")
    monkeypatch.setattr(gen, "PLAIN", (("HEADSTART_SHARED", "x", "y", "shared/headstart/paths.py"),))
    with pytest.raises(gen.SettingsDocError, match="HEADSTART_SHARED"):
        gen.plain_rows(tmp_path)


def test_every_error_code_has_a_row_in_the_errors_table():
    """The Errors table (docs/operations.md) names every code an edge can send, with its HTTP and gRPC statuses."""
    from headstart.client.errors import CODES

    readme = (ROOT / "docs" / "operations.md").read_text()
    section = readme[readme.index("## Errors"):]
    section = section[:section.index("\n#")]
    rows = {line.split("|")[1].strip().strip("`"): line.split("|") for line in section.splitlines()
            if line.startswith("| `")}
    assert set(rows) == set(CODES)
    for code, (grpc_code, http) in CODES.items():
        assert rows[code][3].strip() == str(http) and rows[code][4].strip() == grpc_code.name, code
