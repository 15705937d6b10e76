"""Generate the configuration table of docs/configuration.md: every `HEADSTART_*` setting, its default and meaning.

    .venv/bin/python scripts/gen_settings_table.py          # rewrite the table in docs/configuration.md
    .venv/bin/python scripts/gen_settings_table.py --check  # exit 1 when the table is stale

Rows come from the code: the fields of the pydantic settings objects
(`EngineSettings`, env prefix `HEADSTART_`; `GatewaySettings`,
`HEADSTART_GATEWAY_`; `TableCacheSettings`, `HEADSTART_TABLECACHE_`;
`FlashSettings`, `HEADSTART_FLASH_`), each
with its default and its `Field(description=...)`, then the variables some
module reads with `os.environ` (`PLAIN`, each checked to appear in the file
named beside it). The table sits between the two MARKER lines of docs/configuration.md.
tests/test_settings_table.py fails when the table is stale or when a
`HEADSTART_*` name in the code is in no row.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "docs" / "configuration.md"  # the page that holds the table
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]  # this checkout's settings, not an installed copy
BEGIN, END = "<!-- settings-table:begin (scripts/gen_settings_table.py) -->", "<!-- settings-table:end -->"


class SettingsDocError(ValueError):
    """A settings field without a description, or a plain variable its file does not read."""


@dataclass(frozen=True)
class Row:
    name: str  # the environment variable
    default: str  # as shown in the table
    meaning: str
    read_by: str


# (settings class "module:Class", who reads it)
SETTINGS_CLASSES = (
    ("headstart.config:EngineSettings", "engine"),
    ("services.gateway.settings:GatewaySettings", "gateway"),
    ("services.tablecache.settings:TableCacheSettings", "table-cache service"),
    ("services.flash.settings:FlashSettings", "flash worker"),
)

# Variables read with os.environ: (name, default, meaning, file that reads it).
# (HEADSTART_SPIDER_DIR, read by paths.py too, is EngineSettings.spider_dir's row.)
PLAIN = (
    ("HEADSTART_SHARED", "`../shared` beside the checkout", "the read-only data folder (tokenizer, Spider, BIRD)",
     "shared/headstart/paths.py"),
    ("HEADSTART_TOKENIZER", "`$HEADSTART_SHARED/models/...`", "tokenizer of the `random:<preset>` models",
     "shared/headstart/paths.py"),
    ("HEADSTART_BIRD_DIR", "`$HEADSTART_SHARED/data/bird`", "BIRD data folder (`eval --dataset bird-dev`)",
     "shared/headstart/paths.py"),
    ("HEADSTART_MODELS", "`$HEADSTART_HOME/models`", "where catalogue models' GGUF files are assembled "
     "(`headstart model install`)", "shared/headstart/models/install.py"),
    ("HEADSTART_CPU_ISA", "`auto` (the best this CPU runs)", "restrict the kernels to an instruction-set level: "
     "`avx2`, `avx512`, `avx512vnni` (an AVX-512 machine runs and tests the AVX2 kernels; a level the CPU lacks is "
     "refused)", "shared/headstart/kernels/cpu_isa.py"),
    ("HEADSTART_HOME", "`.headstart/`", "run directory: P0 caches, Ray temp files, logs, peer exports",
     "shared/headstart/paths.py"),
    ("HEADSTART_TEST_WORKERS", "`2`", "pytest-xdist workers of `./run.sh test` (0: the suite in one process, "
     "~27 min on 2 cores; 2: ~13-18 min)", "run.sh"),
    ("HEADSTART_CATALOGUE_SPIDER", "`1`", "`0` leaves the Spider ids out of the catalogue",
     "shared/headstart/schema/catalogue.py"),
    ("HEADSTART_CATALOGUE_SQLITE_ROOTS", "none", "folders (`os.pathsep` separated) whose SQLite files are "
     "served by name (`<root>/team/sales.db` is `team/sales`)", "shared/headstart/schema/catalogue.py"),
    ("HEADSTART_CATALOGUE_POSTGRES", "none", "PostgreSQL databases by alias: `alias=postgresql://...` "
     "entries separated by whitespace", "shared/headstart/schema/catalogue.py"),
    ("HEADSTART_CATALOGUE_POSTGRES_FILE", "none", "a file of `alias=DSN` lines (a mounted Secret)",
     "shared/headstart/schema/catalogue.py"),
    ("HEADSTART_ENGINE_SECRET", "`headstart serve`: a fresh one per start", "the secret every call to the "
     "engine carries (gateway and replicas)", "services/engine/guard.py"),
    ("HEADSTART_ENGINE_SECRET_FILE", "none", "a file holding the engine secret", "services/engine/guard.py"),
    ("HEADSTART_ENGINE_BIND_HOST", "`127.0.0.1`", "where the local stack's Serve gRPC servers listen "
     "(`0.0.0.0` or `::`: all interfaces)", "services/engine/loopback.py"),
    ("HEADSTART_ENGINE_DIRECT", "`on`", "replicas serve session streams at a port of their own (`off`: "
     "through Serve's proxy only)", "services/engine/direct.py"),
    ("HEADSTART_ENGINE_DIRECT_HOST", "`127.0.0.1`", "bind address of a replica's direct session port",
     "services/engine/direct.py"),
    ("HEADSTART_ENGINE_DIRECT_PORTS", "`0` (a free port)", "port, or range `9100-9115`, of a replica's direct "
     "session port (the first free one)", "services/engine/direct.py"),
    ("HEADSTART_ENGINE_DIRECT_ADVERTISE", "the bind host (a wildcard: the node's IP)", "the host the gateway "
     "dials for a replica's direct port", "services/engine/direct.py"),
    ("HEADSTART_REDIS_SERVER", "`redis-server`, then `valkey-server` on PATH", "the Redis binary a private "
     "Redis is started from (`serve`'s embedded one, `bench tables`)", "shared/headstart/redis_server.py"),
    ("HEADSTART_POSTGRES_DSN", "none: a temporary local server", "PostgreSQL of `eval --executor postgres`",
     "shared/headstart/eval/cli.py"),
    ("HEADSTART_PG_BIN", "PATH, then `/usr/lib/postgresql/*/bin`", "folder of `initdb` and `pg_ctl` for a "
     "temporary PostgreSQL", "shared/headstart/eval/local_postgres.py"),
    ("HEADSTART_LLAMACPP_SRC", "llama-cpp-python's sdist", "a llama.cpp checkout with `convert_hf_to_gguf.py` "
     "(`peer llamacpp`)", "shared/headstart/peer/gguf_convert.py"),
    ("HEADSTART_LLAMA_SERVER", "a build of `headstart peer build-server` under `.headstart/peer/`",
     "path of a llama.cpp `llama-server` binary for the peer benchmarks", "shared/headstart/peer/server_build.py"),
    ("HEADSTART_TOKEN", "none", "tenant token of `headstart deploy smoke`", "services/deploy/cli.py"),
    ("HEADSTART_LOADTEST_*", "set by `headstart loadtest`", "internal: the load test's settings, passed to "
     "its Locust process", "loadtest/settings.py"),
    ("HEADSTART_TEST_REDIS_URL", "none: a private server", "tests only: use this Redis", "tests/redis_fixture.py"),
    ("HEADSTART_TEST_POSTGRES_DSN", "none: a private server", "tests only: use this PostgreSQL",
     "tests/pg_fixture.py"),
    ("HEADSTART_CHROMIUM", "`chromium`", "tests only: the browser of the page test", "tests/cdp.py"),
)


def _import(path: str):
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _default(field) -> str:
    from pydantic_core import PydanticUndefined

    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined or value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (dict, list)):
        return "`{}`" if isinstance(value, dict) and not value else ("`[]`" if not value else f"`{value!r}`")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def settings_rows(classes=SETTINGS_CLASSES) -> list[Row]:
    """One row per field of each settings class (("module:Class" or the class, who reads it) pairs).

    Raises:
        SettingsDocError: a field has no description.
    """
    rows = []
    for path, read_by in classes:
        cls = _import(path) if isinstance(path, str) else path
        prefix = cls.model_config["env_prefix"]
        for name, field in cls.model_fields.items():
            if not field.description:
                raise SettingsDocError(f"{path}.{name} has no Field(description=...)")
            rows.append(Row(prefix + name.upper(), _default(field), field.description, read_by))
    return rows


def plain_rows(root: Path = ROOT) -> list[Row]:
    """The PLAIN variables, each checked to be named in the file it is said to be read by.

    Raises:
        SettingsDocError: the file does not mention the variable.
    """
    rows = []
    for name, default, meaning, where in PLAIN:
        if name.rstrip("*") not in (root / where).read_text():
            raise SettingsDocError(f"{where} does not mention {name}")
        rows.append(Row(name, default, meaning, f"`{where}`"))
    return rows


def _markdown(text: str) -> str:
    """`text` for a table cell: `|` is a column break, `<x>` outside code spans an HTML tag."""
    parts = text.replace("|", "/").split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def table() -> str:
    """The Markdown table; one row per variable.

    Raises:
        SettingsDocError: two rows name one variable.
    """
    rows = settings_rows() + plain_rows()
    names = [row.name for row in rows]
    if len(set(names)) != len(names):
        raise SettingsDocError(f"variables with two rows: {sorted({n for n in names if names.count(n) > 1})}")
    lines = ["| variable | default | meaning | read by |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| `{row.name}` | {row.default} | {_markdown(row.meaning)} | {row.read_by} |")
    return "\n".join(lines)


def render_readme(readme: str) -> str:
    """The page with the table between the markers replaced."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table() + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the table is current")
    ns = parser.parse_args(argv)
    readme = README.read_text()
    rendered = render_readme(readme)
    if ns.check:
        if rendered != readme:
            print("docs/configuration.md's settings table is stale: run scripts/gen_settings_table.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
