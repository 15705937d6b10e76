"""`headstart serve`: the local stack (Ray, the engine deployment, the gateway, Redis), `services.launcher`."""

from __future__ import annotations

from typing import Optional

import typer

from cli.common import MODEL_HELP, TABLE_CACHE_HELP, check_table_cache
from headstart.models.catalogue import DEFAULT_MODEL


def serve(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    host: str = typer.Option("127.0.0.1", help="gateway bind address (loopback only without --token)"),
    port: int = typer.Option(8080, help="HTTP port: page, REST, WebSocket, /healthz, /metrics"),
    grpc_port: int = typer.Option(50051, help="public gRPC port"),
    replicas: int = typer.Option(1, help="engine replicas (Ray Serve, sticky by session id)"),
    token: list[str] = typer.Option([], help="bearer token, TOKEN or TENANT=TOKEN (repeat)"),
    redis_url: Optional[str] = typer.Option(None, "--redis", help="redis:// URL of the data sessions' store "
                                            "(default $HEADSTART_REDIS_URL; neither: an embedded one is started)"),
    max_sessions: int = typer.Option(64, help="sessions per replica"),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads per replica (default: cores / replicas)"),
    table_cache: str = typer.Option("off", help=TABLE_CACHE_HELP),
    openai_database: str = typer.Option("", help="database of an OpenAI completion that names none "
                                        "(default: the request must name it, body field `database`)"),
    ray_address: Optional[str] = typer.Option(None, help="join this Ray cluster (its GCS host:port) instead of "
                                              "starting one; run on one of its nodes"),
    replica_resource: Optional[str] = typer.Option(None, help="Ray custom resource each replica asks one unit "
                                                   "of (one unit per node: one replica per node)"),
):
    """Start the local stack: Ray, the engine deployment, the gateway (and Redis). Ctrl-C stops it all."""
    # NOTE: imported here: `services` brings Ray Serve and FastAPI, which no other command needs at start.
    from services.launcher import serve_command

    check_table_cache(table_cache)
    serve_command(model=model, dtype=dtype, host=host, port=port, grpc_port=grpc_port, replicas=replicas,
                  tokens=token, device=device, redis_url=redis_url, max_sessions=max_sessions, threads=threads,
                  table_cache=table_cache, openai_database=openai_database, block=True,
                  ray_address=ray_address, replica_resource=replica_resource, say=typer.echo)
