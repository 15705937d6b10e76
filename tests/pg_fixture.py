"""A real PostgreSQL server for tests: the session-scoped `postgres_dsn` fixture.

With env HEADSTART_TEST_POSTGRES_DSN set, that server is used as is.
Otherwise a throw-away cluster is made with `initdb` in a temporary folder and
`postgres` is started on a free 127.0.0.1 port (its unix socket in the same
folder), with trust auth, and stopped at the end of the session. PostgreSQL
refuses to run as root, so under root the cluster belongs to, and the server
runs as, the unprivileged user `nobody`.

`postgres_database` gives each test a new, empty database on that server.

Tests are skipped only when no PostgreSQL server binaries can be found; any
other failure to start the server fails the tests, with the server's log.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

DSN_ENV = "HEADSTART_TEST_POSTGRES_DSN"
UNPRIVILEGED_USER = "nobody"
START_TIMEOUT_S = 60.0
# Small and unsafe on purpose: a test cluster on a shared 2-core machine.
_SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "16MB",
    "max_connections": "20",
    "listen_addresses": "127.0.0.1",
}


def find_postgres_bin_dir() -> Path | None:
    """The folder holding both `initdb` and `postgres`: PATH first, then Debian/RPM layouts."""
    initdb = shutil.which("initdb")
    if initdb:
        folder = Path(os.path.realpath(initdb)).parent
        if (folder / "postgres").is_file():
            return folder
        if shutil.which("postgres"):
            return Path(initdb).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += sorted(glob.glob("/usr/pgsql-*/bin"), reverse=True)
    for folder in map(Path, candidates):
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Cluster:
    """One initdb'd data folder and its running server."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.run_as = _unprivileged_user() if os.geteuid() == 0 else None
        # Under root, `nobody` must be able to reach the folder: pick a temp
        # dir whose every ancestor others may traverse.
        parent = _traversable_temp_dir() if self.run_as is not None else None
        self.root = Path(tempfile.mkdtemp(prefix="headstart-pg-", dir=parent))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.process: subprocess.Popen | None = None
        if self.run_as is not None:
            os.chown(self.root, self.run_as.pw_uid, self.run_as.pw_gid)
        os.chmod(self.root, 0o700)

    def _user_kwargs(self) -> dict:
        if self.run_as is None:
            return {}
        return {"user": self.run_as.pw_uid, "group": self.run_as.pw_gid, "extra_groups": []}

    def initdb(self) -> None:
        cmd = [
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(
            cmd, cwd=self.root, capture_output=True, text=True, timeout=120, **self._user_kwargs()
        )
        if done.returncode != 0:
            output = f"{done.stdout}\n{done.stderr}"
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{output}")

    def start(self, port: int) -> None:
        cmd = [str(self.bin_dir / "postgres"), "-D", str(self.data)]
        cmd += ["-p", str(port), "-k", str(self.root)]
        for key, value in _SERVER_SETTINGS.items():
            cmd += ["-c", f"{key}={value}"]
        with open(self.log, "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                cmd, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, **self._user_kwargs()
            )

    def wait_ready(self, port: int) -> None:
        """Poll until the server answers. The probe goes through this cluster's own
        unix socket, so a foreign server on the same TCP port can never answer it."""
        probe = {"host": str(self.root), "port": port, "user": "postgres", "dbname": "postgres"}
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"postgres exited with {code}:\n{self.log_text()}")
            try:
                psycopg.connect(connect_timeout=2, **probe).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError(f"postgres not ready after {START_TIMEOUT_S:.0f}s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # "fast" shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def _traversable_temp_dir() -> str:
    for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        path = Path(candidate).resolve()
        if path.is_dir() and all(os.stat(p).st_mode & stat.S_IXOTH for p in (path, *path.parents)):
            return str(path)
    raise RuntimeError("no temporary folder that an unprivileged user can reach")


def _unprivileged_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root and there is no {UNPRIVILEGED_USER!r} user to run PostgreSQL as "
            f"(initdb refuses root); set {DSN_ENV} to a running server instead"
        ) from None


def start_cluster(bin_dir: Path, attempts: int = 3) -> tuple[_Cluster, str]:
    """initdb + start on a free port; a port taken between probe and bind is retried."""
    cluster = _Cluster(bin_dir)
    try:
        cluster.initdb()
        for attempt in range(1, attempts + 1):
            port = _free_port()
            dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            cluster.start(port)
            try:
                cluster.wait_ready(port)
            except RuntimeError:
                if attempt == attempts or "could not bind" not in cluster.log_text():
                    raise
                continue
            return cluster, dsn
        raise RuntimeError(f"no free port after {attempts} attempts")
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A DSN of a PostgreSQL server the tests may create schemas in."""
    env_dsn = os.environ.get(DSN_ENV)
    if env_dsn:
        yield env_dsn
        return
    bin_dir = find_postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, postgres) not found on PATH, in "
            f"/usr/lib/postgresql/*/bin or /usr/pgsql-*/bin; install them or set {DSN_ENV}"
        )
    try:
        cluster, dsn = start_cluster(bin_dir)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"could not start a test PostgreSQL server from {bin_dir}: {exc}", pytrace=False)
    try:
        yield dsn
    finally:
        cluster.stop()


def dsn_for_database(dsn: str, dbname: str) -> str:
    """A `postgresql://` URI for database `dbname` on the server of `dsn` (URI or key=value)."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if k != "dbname"}
    return f"postgresql:///{quote(dbname)}?{urlencode(sorted(params.items()))}"


@pytest.fixture
def postgres_database(postgres_dsn: str) -> Iterator[str]:
    """A `postgresql://` URI of a new, empty database, dropped after the test."""
    name = f"headstart_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield dsn_for_database(postgres_dsn, name)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
