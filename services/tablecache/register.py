"""`python -m services.tablecache.register`: register databases with a table-cache service.

What the chart's post-install/upgrade Job runs:

    python -m services.tablecache.register --target HOST:PORT \
        --databases-file /etc/headstart/databases/databases.json [--precompute] [--wait-s 600]

It waits for the service's health check to answer SERVING (the service may
still be loading its model), registers each database and, with
`--precompute`, streams the precompute's progress. It exits 1 when any
database failed (the Job retries), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headstart.schema.dsn import is_postgres_dsn, redact_dsn
from headstart.v1 import tablecache_pb2, tablecache_pb2_grpc


def read_databases(path: Path) -> list[str]:
    """The JSON list of database specs in `path`.

    Raises:
        ValueError: the file is not a JSON list of non-empty strings.
    """
    data = json.loads(path.read_text())
    if not isinstance(data, list) or not all(isinstance(d, str) and d.strip() for d in data):
        raise ValueError(f"{path}: expected a JSON list of database specs (strings)")
    return [d.strip() for d in data]


def wait_serving(channel: grpc.Channel, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll grpc.health.v1 until the service answers SERVING.

    Raises:
        TimeoutError: not SERVING within `timeout_s`.
    """
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"table-cache service not SERVING after {timeout_s:.0f} s ({last})")
        sleep(2.0)


def register_all(stub: tablecache_pb2_grpc.TableCacheStub, specs: list[str], *, precompute: bool,
                 say: Callable[[str], None] = print) -> int:
    """Register (and precompute) each spec; returns how many failed."""
    failed = 0
    for spec in specs:
        try:
            status = stub.RegisterDatabase(tablecache_pb2.TableCacheDatabaseRef(spec=spec))
            say(f"{status.name}: registered db_id={status.db_id} schema={status.schema_hash[:12]} "
                f"tables={status.num_tables} blocks={status.num_blocks}")
            if precompute:
                for step in stub.Precompute(tablecache_pb2.TableCachePrecomputeRequest(spec=spec)):
                    if step.HasField("status"):
                        s = step.status
                        say(f"{s.name}: {s.num_blocks}/{s.num_tables} blocks, {s.num_bytes / 2**20:.1f} MiB")
                    else:
                        what = "stored already" if step.skipped else f"{step.num_tokens} tokens"
                        say(f"  group {step.group_index + 1}/{step.num_groups} {','.join(step.tables)}: {what}")
        except grpc.RpcError as exc:
            failed += 1
            say(f"error: {display_name(spec)}: {exc.code().name}: {exc.details()}")
    return failed


def display_name(spec: str) -> str:
    """The spec as it may be printed: a DSN's password redacted."""
    return redact_dsn(spec) if is_postgres_dsn(spec) else spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of the table-cache service")
    parser.add_argument("--databases-file", type=Path, help="JSON list of database specs")
    parser.add_argument("--db", action="append", default=[], help="a database spec (repeatable)")
    parser.add_argument("--precompute", action="store_true", help="precompute blocks after registering")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the service")
    ns = parser.parse_args(argv)
    try:
        specs = list(ns.db) + (read_databases(ns.databases_file) if ns.databases_file else [])
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not specs:
        print("no databases to register")
        return 0
    with grpc.insecure_channel(ns.target) as channel:
        try:
            wait_serving(channel, ns.wait_s)
        except TimeoutError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        failed = register_all(tablecache_pb2_grpc.TableCacheStub(channel), specs, precompute=ns.precompute)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
