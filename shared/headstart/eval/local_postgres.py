"""Start a throw-away PostgreSQL on a free loopback port, and stop it again.

Used by `headstart eval --executor postgres` when no DSN is configured, and
reusable by test fixtures. The server is initialised into a fresh temporary
folder (trust auth, C locale so ORDER BY on text sorts like SQLite's binary
collation, fsync off since the data is disposable) and removed on exit.

PostgreSQL refuses to run as root: when the caller is root, initdb and the
server run as `nobody` (configurable) and the folder is handed to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from headstart.eval.errors import LocalPostgresError

_SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off "
    "-c max_connections=50"
)


def find_pg_bin() -> Path:
    """The folder holding initdb and pg_ctl: env HEADSTART_PG_BIN, then PATH, then /usr/lib/postgresql/*/bin."""
    env = os.environ.get("HEADSTART_PG_BIN")
    candidates = [Path(env)] if env else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    raise LocalPostgresError(
        "PostgreSQL binaries (initdb, pg_ctl) not found; searched "
        f"{', '.join(map(str, candidates)) or 'nothing'}; set HEADSTART_PG_BIN or install postgresql"
    )


def free_port() -> int:
    """A loopback port free right now (another process may still take it: `start` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalPostgres:
    """Context manager: `with LocalPostgres() as pg: psycopg.connect(pg.dsn)`."""

    def __init__(self, base_dir: Path | None = None, run_as: str = "nobody", start_timeout_s: int = 60) -> None:
        self.base_dir = base_dir
        self.run_as = run_as if os.geteuid() == 0 else None
        self.start_timeout_s = start_timeout_s
        self.port: int | None = None
        self.root: Path | None = None
        self._bin: Path | None = None

    @property
    def dsn(self) -> str:
        if self.port is None:
            raise LocalPostgresError("the local PostgreSQL is not running; use it inside `with`")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __enter__(self) -> "LocalPostgres":
        self.start()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """initdb into a temporary folder and start the server; LocalPostgresError on failure."""
        self._bin = find_pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="headstart-pg-", dir=self.base_dir))
        try:
            self._give_to_server_user(self.root)
            self._run(["initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                       "--encoding=UTF8", "--no-locale", "--no-sync"])
            (self.root / "sock").mkdir()
            self._give_to_server_user(self.root / "sock")
            for _attempt in range(3):
                port = free_port()
                options = f"-p {port} -k {self.root / 'sock'} {_SERVER_OPTIONS}"
                done = self._run(["pg_ctl", "-D", str(self.data_dir), "-l", str(self.root / "server.log"),
                                  "-w", "-t", str(self.start_timeout_s), "-o", options, "start"], check=False)
                if done.returncode == 0:
                    self.port = port
                    return
            raise LocalPostgresError(f"PostgreSQL did not start; log:\n{self._log_tail()}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (immediate mode: the data is disposable) and delete its folder."""
        if self.root is None:
            return
        if self.port is not None:
            self._run(["pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"], check=False)
            self.port = None
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    @property
    def data_dir(self) -> Path:
        if self.root is None:
            raise LocalPostgresError("no data folder: the server was not started")
        return self.root / "data"

    def _give_to_server_user(self, path: Path) -> None:
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
        if self._bin is None or self.root is None:
            raise LocalPostgresError("internal: start() sets the binaries and folder before any command")
        user_args: dict = {}
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            user_args = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        done = subprocess.run(
            [str(self._bin / args[0]), *args[1:]], cwd=self.root, capture_output=True, text=True,
            env={**os.environ, "LC_ALL": "C"}, **user_args,
        )
        if check and done.returncode != 0:
            output = done.stderr.strip() or done.stdout.strip()
            raise LocalPostgresError(f"{args[0]} failed ({done.returncode}): {output}")
        return done

    def _log_tail(self) -> str:
        log = self.root / "server.log" if self.root else None
        return log.read_text(errors="replace")[-2000:] if log and log.exists() else "(no log)"
