"""Faults injected into a load test of the local stack, and what the run must show after them (issue 29).

(`node-kill`, a whole Ray node lost: loadtest/node_kill.py.)

`redis-restart`: halfway through the run the stack's Redis is killed
(SIGKILL: a crash) and kept down for `down_s`, then started again on its
port from its append-only file. Afterwards:

- **no acknowledged row is lost**: every seq a push acknowledged (the data
  users write them to `acked.jsonl`) is in its session's rows log in Redis,
  and each session's data version reaches its newest acknowledged seq;
- **every client error is typed**: each failed request carries one of the
  API's codes (UNAVAILABLE while Redis is down); a transport error or a
  timeout is not typed.

Runs in the `headstart loadtest` process (the Ray driver, beside the local
stack), never in Locust's: nothing here imports gevent.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from headstart.client.errors import CODES

FAULTS = ("redis-restart", "node-kill")  # node-kill: loadtest/node_kill.py
SETTLE_S = 120.0  # how long the sessions may take to ingest what was pushed before the verdict


class RedisRestart:
    """Kill the stack's embedded Redis at `at_s` after `start()`, keep it down `down_s`, start it again."""

    def __init__(self, stack, at_s: float, down_s: float, say=print):
        if stack.redis_server is None:
            raise ValueError("--faults redis-restart needs the local stack's embedded Redis (no --redis, no --host)")
        self.stack, self.at_s, self.down_s, self.say = stack, at_s, down_s, say
        self.record: dict = {"kind": "redis-restart", "at_s": at_s, "down_s": down_s, "restarted": False}
        self._timer = threading.Timer(at_s, self._inject)
        self._timer.daemon = True

    def start(self) -> RedisRestart:
        self._started = time.monotonic()
        self._timer.start()
        return self

    def _inject(self) -> None:
        server = self.stack.redis_server
        with self.stack.redis_watchdog.paused():  # the watchdog would restart it within a second
            self.say(f"fault: killing redis-server on {server.url} for {self.down_s:g} s")
            self.record["killed_at_s"] = round(time.monotonic() - self._started, 2)
            server.kill()
            time.sleep(self.down_s)
            server.start()
        self.record.update(restarted=True, back_at_s=round(time.monotonic() - self._started, 2))
        self.say("fault: redis-server is back (from its append-only file)")

    def wait(self) -> None:
        self._timer.join()


def acked_rows(path: Path) -> dict[tuple[str, str], list[int]]:
    """(token, session id) -> every seq its pushes acknowledged, from the users' `acked.jsonl`."""
    out: dict[tuple[str, str], list[int]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                out.setdefault((record["token"], record["sid"]), []).extend(record["seqs"])
    return out


def check_acked(http_url: str, redis_url: str, tenants: dict[str, str], acked: dict[tuple[str, str], list[int]],
                settle_s: float = SETTLE_S) -> dict:
    """Every acknowledged seq in its session's rows log, and each session ingested up to its newest;
    then the sessions are closed (the users left them open for this). `tenants`: token -> tenant."""
    from headstart.data.live_store import LiveStore
    from services.gateway.sessions import engine_session_id

    store = LiveStore(redis_url)
    lost, behind, lags = [], [], []
    stopped = time.monotonic()  # the load has stopped: each session's catch-up is timed from here
    try:
        with httpx.Client(base_url=http_url, timeout=60) as http:
            for (token, sid), seqs in sorted(acked.items()):
                logged = {seq for seq, _ in store.rows(engine_session_id(tenants[token], sid))}
                lost += [{"session": sid, "seq": s} for s in sorted(set(seqs) - logged)]
                headers = {"Authorization": f"Bearer {token}"}
                version, lag, caught_up = _ingested_version(http, sid, headers, max(seqs), settle_s, stopped)
                lags.append({"session": sid, "lag_at_check": lag, "caught_up_s": caught_up})
                if version < max(seqs):
                    behind.append({"session": sid, "data_version": version, "newest_acked": max(seqs)})
                http.delete(f"/v1/data/{sid}", headers=headers)
    finally:
        store.close()
    caught = [entry["caught_up_s"] for entry in lags if entry["caught_up_s"] is not None]
    return {"sessions": len(acked), "acked_rows": sum(len(s) for s in acked.values()), "lost_rows": len(lost),
            "lost": lost[:20], "sessions_behind": behind, "lag": lags,
            "caught_up_s_max": round(max(caught), 2) if caught else None}


def _ingested_version(http: httpx.Client, sid: str, headers: dict, want: int, settle_s: float,
                      stopped: float) -> tuple[int, dict | None, float | None]:
    """(the session's data version, its lag at the first look, seconds from `stopped` until it had
    ingested `want`: None when it never did within `settle_s`)."""
    end, version, first_lag = time.monotonic() + settle_s, -1, None
    while time.monotonic() < end:
        r = http.get(f"/v1/data/{sid}", headers=headers)
        if r.status_code == 200:
            described = r.json()
            version = described["data_version"]
            if first_lag is None:
                first_lag = described.get("lag")
            if version >= want:
                return version, first_lag, round(time.monotonic() - stopped, 2)
        time.sleep(0.5)  # polling the replica's ingestion
    return version, first_lag, None


def is_typed(code: str | None) -> bool:
    """One of the API's codes, as gRPC and REST name it or as the OpenAI edge does (OpenAI's own
    name where it has one, else ours in lower case: services/gateway/openai_errors.py)."""
    from services.gateway.openai_errors import OPENAI_CODE_NAMES

    return bool(code) and (code in CODES or code.upper() in CODES or code in OPENAI_CODE_NAMES)


def typed_errors(samples: list[dict]) -> dict:
    """The run's failed requests by code; `untyped`: those with none of the API's codes (a transport
    error, a timeout, a bare HTTP status)."""
    failed = [s for s in samples if s["error"]]
    codes = Counter(s.get("code") or s["error"] for s in failed)
    untyped = [s for s in failed if not is_typed(s.get("code"))]
    return {"errors": len(failed), "by_code": dict(sorted(codes.items())), "untyped": len(untyped),
            "untyped_kinds": dict(Counter(f"{s['user']}:{s['name']}:{s['error']}" for s in untyped))}
