"""The catalogue: the only databases a served client may name.

A client names a database; the operator decides what the name means. Names
come from three sources, all configured on the server, never by a client:

- Spider ids from `<spider_dir>/tables.json` (the spec is the id itself);
- SQLite files under configured roots: `<root>/sales.sqlite` is `sales`,
  `<root>/team/sales.db` is `team/sales` (the spec is the absolute path);
- PostgreSQL DSNs by alias (`alias=postgresql://...`; the spec is the DSN).

`Catalogue.spec(name)` is a dictionary lookup: a client's string never reaches
the filesystem or the network, and an unknown name fails with the same
message whether or not a file or host by that name exists.

Environment (read by `Catalogue.from_env`, used by `headstart serve` and the
engine replicas when no explicit configuration is given):
- `HEADSTART_CATALOGUE_SQLITE_ROOTS`: folders, separated by `os.pathsep`;
- `HEADSTART_CATALOGUE_POSTGRES`: `alias=DSN` entries separated by whitespace;
- `HEADSTART_CATALOGUE_POSTGRES_FILE`: a file of `alias=DSN` lines (a mounted
  Kubernetes Secret, say);
- `HEADSTART_CATALOGUE_SPIDER=0` leaves the Spider ids out.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from headstart.paths import default_spider_dir
from headstart.schema.dsn import is_postgres_dsn, redact_dsn
from headstart.schema.model import SchemaError

log = logging.getLogger(__name__)

EntryKind = Literal["spider", "sqlite", "postgres"]
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,127}$")
MAX_SQLITE_FILES = 10_000  # per root: a huge tree is a misconfiguration, not a catalogue
RESCAN_INTERVAL_S = 5.0  # a miss rescans the roots at most this often (files added while serving)


class UnknownDatabase(SchemaError):
    """A name the catalogue does not hold. The message names nothing but the name."""

    code = "NOT_FOUND"


@dataclass(frozen=True)
class CatalogueEntry:
    """One registered database. `spec` (a path or a DSN with its password) stays out of the repr."""

    name: str
    kind: EntryKind
    spec: str = field(repr=False)

    @property
    def sqlite_path(self) -> Path | None:
        return Path(self.spec) if self.kind == "sqlite" else None


def unknown(name: object) -> UnknownDatabase:
    """The one error for a name the catalogue lacks (shortened: the name may be huge)."""
    shown = name if isinstance(name, str) else type(name).__name__
    shown = redact_dsn(shown) if is_postgres_dsn(shown) else shown  # not even the caller's own password echoed
    shown = shown if len(shown) <= 64 else shown[:61] + "..."
    return UnknownDatabase(f"unknown database {shown!r}; GET /v1/databases lists the ones served")


class Catalogue:
    """Registered databases by name; thread-safe; SQLite roots are rescanned on a miss."""

    def __init__(self, spider_dir: str | Path | None = None, sqlite_roots: list[str | Path] | tuple = (),
                 postgres: dict[str, str] | None = None, include_spider: bool = True):
        self.spider_dir = Path(spider_dir) if spider_dir else default_spider_dir()
        self.sqlite_roots = [Path(r).resolve() for r in sqlite_roots]
        self.include_spider = include_spider
        self._lock = threading.Lock()
        self._fixed: dict[str, CatalogueEntry] = {}
        self._sqlite: dict[str, CatalogueEntry] = {}
        self._scanned_at = 0.0
        if include_spider:
            for db in _spider_ids(self.spider_dir):
                self._fixed[db] = CatalogueEntry(db, "spider", db)
        for alias, dsn in (postgres or {}).items():
            if not NAME_PATTERN.match(alias) or not is_postgres_dsn(dsn):
                raise ValueError(f"bad PostgreSQL catalogue entry {alias!r}={redact_dsn(dsn)!r}: "
                                 "use alias=postgresql://...")
            self._fixed.setdefault(alias, CatalogueEntry(alias, "postgres", dsn))
        self._rescan()

    @classmethod
    def from_env(cls, spider_dir: str | Path | None = None, environ: dict | None = None,
                 extra_roots: list[str | Path] | tuple = ()) -> "Catalogue":
        """The catalogue the environment configures (see the module docstring), plus `extra_roots`."""
        env = os.environ if environ is None else environ
        roots = [r for r in env.get("HEADSTART_CATALOGUE_SQLITE_ROOTS", "").split(os.pathsep) if r.strip()]
        roots += list(extra_roots)
        text = env.get("HEADSTART_CATALOGUE_POSTGRES", "")
        path = env.get("HEADSTART_CATALOGUE_POSTGRES_FILE")
        if path:
            text += "\n" + Path(path).read_text()
        return cls(spider_dir, roots, parse_postgres_aliases(text),
                   include_spider=env.get("HEADSTART_CATALOGUE_SPIDER", "1") not in ("0", "false", "no"))

    def entry(self, name: object) -> CatalogueEntry:
        """The entry named `name`.

        Raises:
            UnknownDatabase: not a registered name (the same error for every
                unregistered string: paths, DSNs, typos).
        """
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise unknown(name)
        with self._lock:
            found = self._fixed.get(name) or self._sqlite.get(name)
        if found is None and self.sqlite_roots and time.monotonic() - self._scanned_at > RESCAN_INTERVAL_S:
            self._rescan()
            with self._lock:
                found = self._sqlite.get(name)
        if found is None:
            raise unknown(name)
        return found

    def spec(self, name: object) -> str:
        """What the schema loaders take for `name` (Spider id, absolute path or DSN)."""
        return self.entry(name).spec

    def entries(self) -> list[CatalogueEntry]:
        """Every entry, sorted by name."""
        with self._lock:
            merged = {**self._sqlite, **self._fixed}
        return [merged[n] for n in sorted(merged)]

    def _rescan(self) -> None:
        found: dict[str, CatalogueEntry] = {}
        for root in self.sqlite_roots:
            for path in _sqlite_files(root):
                name = path.relative_to(root).with_suffix("").as_posix()
                if NAME_PATTERN.match(name) and name not in self._fixed:
                    found.setdefault(name, CatalogueEntry(name, "sqlite", str(path)))
        with self._lock:
            self._sqlite = found
            self._scanned_at = time.monotonic()


def parse_postgres_aliases(text: str) -> dict[str, str]:
    """`alias=DSN` entries separated by whitespace (a DSN URI has none) -> {alias: DSN}."""
    out: dict[str, str] = {}
    for item in text.split():
        alias, sep, dsn = item.partition("=")
        if not sep or not alias or not dsn:
            raise ValueError(f"bad PostgreSQL alias entry {redact_dsn(item)!r}: use alias=postgresql://...")
        out[alias] = dsn
    return out


def _spider_ids(spider_dir: Path) -> list[str]:
    from headstart.schema.spider_json import load_spider_tables

    tables = spider_dir / "tables.json"
    if not tables.is_file():
        return []
    return sorted(load_spider_tables(tables))


def _sqlite_files(root: Path) -> list[Path]:
    """SQLite files under `root` that stay under it once symlinks are resolved."""
    if not root.is_dir():
        log.warning("catalogue root %s is not a folder", root)
        return []
    out = []
    for path in sorted(root.rglob("*")):
        if len(out) >= MAX_SQLITE_FILES:
            log.warning("catalogue root %s holds more than %d SQLite files; the rest are left out", root,
                        MAX_SQLITE_FILES)
            break
        if path.suffix.lower() in SQLITE_SUFFIXES and path.is_file():
            real = path.resolve()
            if real == root or root in real.parents:  # a symlink out of the root is not registered
                out.append(path)
    return out
