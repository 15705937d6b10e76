"""`headstart deploy smoke`: one typed question through a deployed gateway.

`run_smoke(target, ...)` is the check: it opens a typing session over the
gateway's public gRPC API, types the question a few characters at a time
(the anticipatory path), submits it and requires a Result with SQL-looking
text and a TTFT. In a cluster `port_forward` first forwards a local port to a
ready gateway pod (the Kubernetes API's pod port-forward), as
`kubectl port-forward` does.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_QUESTION = "How many singers are there?"
DEFAULT_DB = "concert_singer"
_SQL = re.compile(r"\b(select|with)\b", re.IGNORECASE)


class SmokeError(RuntimeError):
    """The deployment did not answer as it should (the message says how)."""


@dataclass(frozen=True)
class SmokeResult:
    sql: str
    ttft_ms: float
    total_ms: float
    wall_ms: float
    prompt_tokens: int


def run_smoke(target: str, *, token: str | None, db: str = DEFAULT_DB, question: str = DEFAULT_QUESTION,
              max_new_tokens: int = 64, chunk: int = 4, pause_s: float = 0.05, timeout_s: float = 120.0,
              require_sql: bool = True) -> SmokeResult:
    """Type `question` against `db` through the gateway at `target` (host:port, gRPC).

    Args:
        require_sql: the answer must look like SQL (SELECT/WITH); off for random-weight models.

    Raises:
        SmokeError: the gateway refused, the stream failed, or the answer has no SQL or TTFT.
    """
    from headstart.client.errors import ApiError
    from headstart.client.sync import HeadstartClient

    started = time.perf_counter()
    try:
        with HeadstartClient(target, token=token, timeout_s=timeout_s) as client:
            typing = client.typing(db)
            for end in range(chunk, len(question), chunk):
                typing.input(question[:end])
                time.sleep(pause_s)
            result = typing.submit(question, max_new_tokens=max_new_tokens)
            typing.close()
    except (ApiError, TimeoutError, OSError) as exc:
        raise SmokeError(f"the gateway at {target} failed the typed question: {exc}") from exc
    except Exception as exc:  # grpc.RpcError and friends: report, do not trace
        raise SmokeError(f"the gateway at {target} failed the typed question: {type(exc).__name__}: {exc}") from exc
    wall_ms = (time.perf_counter() - started) * 1000
    text = result.sql or result.text
    if require_sql and not _SQL.search(text or ""):
        raise SmokeError(f"the answer is not SQL: {text[:200]!r}")
    if result.ttft_ms <= 0:
        raise SmokeError(f"the result carries no TTFT (ttft_ms={result.ttft_ms})")
    return SmokeResult(text, result.ttft_ms, result.total_ms, wall_ms, result.prompt_tokens)


@contextlib.contextmanager
def port_forward(api_client, namespace: str, pod: str, remote_port: int) -> Iterator[int]:
    """Forward a free loopback port to `pod:remote_port` through the API server; yields the local port.

    Each accepted local connection gets its own API port-forward stream.
    """
    from kubernetes import client
    from kubernetes.stream import portforward

    core = client.CoreV1Api(api_client)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def pump(src, dst) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        listener.settimeout(0.5)
        while not stop.is_set():
            try:
                local, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            forward = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace,
                                  ports=str(remote_port))
            remote = forward.socket(remote_port)
            for a, b in ((local, remote), (remote, local)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, name="port-forward", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
        thread.join(2)
