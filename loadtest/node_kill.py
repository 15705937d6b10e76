"""The `node-kill` fault of a load test: a whole Ray node lost mid-run, and what the run must show.

The local stack runs on a cluster of two Ray nodes on this machine
(`services.local_cluster`: the head here, the worker node in a network
namespace of its own), one engine replica on each. Halfway through the run
every process of the worker node (its raylet, object store, agents, the
replica's worker) is SIGKILLed at once, as a machine losing power. Serve
cannot place the replica again (no node has a free slot), so the sessions
it held move to the head's replica: the gateway reattaches each from its
newest snapshot. Afterwards, from the typists' records (`answers.jsonl`):

- **sessions continued / lost**: of the sessions open when the node died
  (opened before, ended after), those that still got their answer, and
  those that failed (each failure must carry an API code: `errors.untyped`);
- **identical output**: every answered session's tokens against a cold run
  of its question on the surviving stack (`Complete`, mode `cold`, same
  answer length), counted apart for the sessions the kill went through;
- nothing acknowledged lost (the data users' pushes: `faults.check_acked`).

Runs in the `headstart loadtest` process (the Ray driver), never in Locust's.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

WORKER_NODE = 1


class NodeKill:
    """SIGKILL every process of the cluster's worker node at `at_s` after `start()`."""

    def __init__(self, cluster, at_s: float, say=print):
        if cluster is None or len(cluster.nodes) < 2:
            raise ValueError("--faults node-kill needs the local stack on a cluster of two Ray nodes")
        self.cluster, self.at_s, self.say = cluster, at_s, say
        self.record: dict = {"kind": "node-kill", "at_s": at_s, "node": WORKER_NODE, "killed": False}
        self._timer = threading.Timer(at_s, self._inject)
        self._timer.daemon = True

    def start(self) -> NodeKill:
        self._started = time.monotonic()
        self._timer.start()
        return self

    def _inject(self) -> None:
        node = self.cluster.nodes[WORKER_NODE]
        self.say(f"fault: killing Ray node {WORKER_NODE} ({node.ip}): every process of its namespace")
        self.record["killed_t"] = time.time()
        pids = self.cluster.kill_node(WORKER_NODE)
        self.record.update(killed=bool(pids), processes=len(pids),
                           killed_at_s=round(time.monotonic() - self._started, 2))

    @property
    def restarted(self) -> bool:
        """What the verdict asks of every fault: it happened (a node does not come back)."""
        return self.record["killed"]

    def wait(self) -> None:
        self._timer.join()


def answer_records(path: Path) -> list[dict]:
    """The typists' session records (`loadtest.users.record_answer`)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_sessions(grpc_target: str, records: list[dict], killed_t: float | None, max_new_tokens: int,
                   timeout_s: float = 300.0) -> dict:
    """Sessions through the kill (continued, lost; killed mid-typing or mid-answer) and answers identical
    to a cold run of the same question (each cold answer computed once, on the surviving stack)."""
    from headstart.client import ApiError, HeadstartClient

    cold: dict[tuple[str, str], list[int] | None] = {}
    spanning = [r for r in records if killed_t is not None and r["opened_t"] <= killed_t <= r["ended_t"]]
    out = {"sessions": len(records), "through_kill": len(spanning),
           "continued": sum(1 for r in spanning if not r["error"]),
           "lost": sum(1 for r in spanning if r["error"]),
           "lost_codes": sorted({r["error"] for r in spanning if r["error"]}),
           "killed_mid_typing": sum(1 for r in spanning if not r["submitted_t"] or r["submitted_t"] > killed_t),
           "killed_mid_answer": sum(1 for r in spanning if r["submitted_t"] and r["submitted_t"] <= killed_t),
           "answered": 0, "identical": 0, "different": [], "answered_through_kill": 0,
           "identical_through_kill": 0}
    by_token: dict[str, HeadstartClient] = {}
    try:
        for r in records:
            if r["error"] or not r["question"]:
                continue
            key = (r["db"], r["question"])
            if key not in cold:
                client = by_token.get(r["token"]) or by_token.setdefault(
                    r["token"], HeadstartClient(grpc_target, r["token"] or None, timeout_s=timeout_s))
                try:
                    cold[key] = list(client.complete(r["db"], r["question"], max_new_tokens, mode="cold").token_ids)
                except ApiError as exc:  # counted, not compared: the verdict fails on it
                    cold[key] = None
                    out.setdefault("cold_errors", []).append(exc.code)
            if cold[key] is None:
                continue
            through = r in spanning
            same = list(r["token_ids"]) == cold[key]
            out["answered"] += 1
            out["identical"] += same
            out["answered_through_kill"] += through
            out["identical_through_kill"] += same and through
            if not same and len(out["different"]) < 10:
                out["different"].append({"question": r["question"], "through_kill": through,
                                         "got": r["token_ids"][:16], "cold": cold[key][:16]})
    finally:
        for client in by_token.values():
            client.close()
    return out
