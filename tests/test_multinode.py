"""Integration: the stack across two Ray nodes on one machine (services/local_cluster.py).

A head node (this machine's network) and a worker node (a network namespace of
its own: its own address, raylet, object store and workers); `headstart serve
--ray-address` joins the cluster with one replica per node. Sessions are routed
by session id to the replica of either node, every call of a session to the
same one, and a typed session's answer is the cold run's tokens wherever it
lives. Last, the worker node is SIGKILLed (every process of its namespace) while
a session on it is mid-typing: the session continues on the head's replica with
the cold run's answer; started again, the node gets its replica back, and killed
once more mid-answer the session gets its whole answer (or a retryable error).
Skipped where network namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter

import grpc
import httpx
import pytest

from headstart.client import HeadstartClient
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.ray_stack import EngineStack
from services.gateway.sessions import engine_session_id
from services.local_cluster import REPLICA_SLOT, LocalCluster, netns_unavailable
from tests.serve_helpers import MAX_NEW
from tests.typing_traces import QUESTIONS, typed

pytestmark = pytest.mark.slow
TOKEN, TENANT = "tok-multi", "multi"
SECRET = "multinode-test-secret"
UP = re.compile(r"headstart is up: page http://localhost:(\d+)/ .* gRPC localhost:(\d+)")


class TwoNodeStack:
    def __init__(self, cluster: LocalCluster, process: subprocess.Popen, http_port: int, grpc_port: int,
                 engine_target: str):
        self.cluster, self.process = cluster, process
        self.http_url, self.grpc_target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
        self.engine = EngineStack(engine_target, secret=SECRET)

    def locate(self, engine_sid: str) -> engine_pb2.EngineLocation:
        """Where Serve routes `engine_sid` (a call through the proxy, sticky by session id)."""
        with grpc.insecure_channel(self.engine.grpc_target) as channel:
            return engine_pb2_grpc.EngineStub(channel).Locate(engine_pb2.EngineSessionRef(session_id=engine_sid),
                                                              metadata=self.engine.metadata(engine_sid), timeout=30)

    def node_of(self, location: engine_pb2.EngineLocation) -> int:
        """The node index a replica runs on, from its direct address (each node binds its own)."""
        host = location.direct_target.rsplit(":", 1)[0]
        return next((n.index for n in self.cluster.nodes[1:] if n.ip == host), 0)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    why = netns_unavailable()
    if why:
        pytest.skip(f"a multi-node local cluster needs network namespaces: {why}")
    cluster = LocalCluster(num_nodes=2, cpus_per_node=1).start()
    log_path = tmp_path_factory.mktemp("multinode") / "serve.log"
    env = {**os.environ, **cluster.client_env(), "HEADSTART_ENGINE_SECRET": SECRET,
           "HEADSTART_HOME": str(log_path.parent)}
    cmd = [sys.executable, "-m", "cli", "serve", "--ray-address", cluster.address, "--replicas", "2",
           "--replica-resource", REPLICA_SLOT, "--model", "random:tiny", "--dtype", "float64", "--port", "0",
           "--grpc-port", "0", "--token", f"{TENANT}={TOKEN}", "--threads", "1"]
    log = open(log_path, "w")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        match, deadline = None, time.monotonic() + 400
        while match is None and time.monotonic() < deadline and process.poll() is None:
            time.sleep(1)
            match = UP.search(log_path.read_text())
        if match is None:
            raise RuntimeError(f"headstart serve --ray-address did not come up:\n{log_path.read_text()[-4000:]}")
        engine = re.search(r"engine at (\S+)", log_path.read_text())
        yield TwoNodeStack(cluster, process, int(match[1]), int(match[2]), engine[1] if engine else "")
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        cluster.stop()


def _session_on(stack: TwoNodeStack, client: HeadstartClient, node: int, tries: int = 24):
    """A typing session of the gateway whose engine session lives on `node` (sessions hash to replicas)."""
    for _ in range(tries):
        session = client.typing("world_1")
        location = stack.locate(engine_session_id(TENANT, session.session_id))
        if stack.node_of(location) == node:
            return session, location
        session.close()
    raise AssertionError(f"no session of {tries} hashed to node {node}")


def test_replicas_on_both_nodes_and_sticky_routing(two_nodes):
    probes = {f"probe-{i}": two_nodes.locate(f"probe-{i}") for i in range(32)}
    nodes = Counter(two_nodes.node_of(loc) for loc in probes.values())
    replicas = {loc.replica for loc in probes.values()}
    assert len(replicas) == 2 and set(nodes) == {0, 1}, (replicas, nodes)
    for sid, first in probes.items():  # every call of a session lands where its first did
        again = [two_nodes.locate(sid).replica for _ in range(5)]
        assert again == [first.replica] * 5, (sid, first.replica, again)


@pytest.mark.parametrize("node", [1, 0], ids=["worker-node", "head-node"])
def test_typed_session_on_either_node_answers_as_cold(two_nodes, tiny_runtime, node):
    question = QUESTIONS[node]
    expected = tiny_runtime.complete("world_1", question, "cold", MAX_NEW).token_ids
    with HeadstartClient(two_nodes.grpc_target, token=TOKEN) as client:
        session, location = _session_on(two_nodes, client, node)
        with session:
            for text in typed(question):
                session.input(text)
            session.wait_caught_up(60)
            result = session.submit(question, MAX_NEW)
    assert list(result.token_ids) == list(expected)
    assert result.replica == location.replica  # answered where Serve routed its typing


def test_worker_node_killed_mid_typing_session_continues_on_the_head(two_nodes, tiny_runtime):
    question = QUESTIONS[2]
    half = len(question) // 2
    expected = tiny_runtime.complete("world_1", question, "cold", MAX_NEW).token_ids
    with HeadstartClient(two_nodes.grpc_target, token=TOKEN) as client:
        session, before = _session_on(two_nodes, client, node=1)
        with session:
            for text in typed(question[:half]):
                session.input(text)
            session.wait_caught_up(60)
            killed = two_nodes.cluster.kill_node(1)
            assert killed, "the worker node had no processes to kill"
            for text in typed(question[half:], question[:half]):
                session.input(text)
            session.wait_caught_up(120)
            result = session.submit(question, MAX_NEW)
    assert list(result.token_ids) == list(expected)
    assert result.replica != before.replica
    after = two_nodes.locate(engine_session_id(TENANT, session.session_id))
    assert two_nodes.node_of(after) == 0
    assert httpx.get(f"{two_nodes.http_url}/healthz", timeout=10).status_code == 200


def _wait_replica_on(stack: TwoNodeStack, node: int, timeout_s: float = 300.0) -> None:
    """Until Serve routes some session to a replica on `node` (one placed there again)."""
    end, probe = time.monotonic() + timeout_s, 0
    while time.monotonic() < end:
        probe += 1
        try:
            if stack.node_of(stack.locate(f"back-{probe}")) == node:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no replica on node {node} within {timeout_s:.0f} s")


def test_worker_node_back_then_killed_mid_answer_answers_or_fails_retryably(two_nodes, tiny_runtime):
    """The killed node started again gets its replica back; killed again while a session on it
    streams its answer: the whole answer (as cold, no token twice) from the head, or a retryable
    UNAVAILABLE, never a hang."""
    cluster = two_nodes.cluster
    if not cluster.nodes[1].killed:  # this cluster's kill test did not run before it (alone, or a fresh fixture)
        assert cluster.kill_node(1)
        time.sleep(8)  # the head declares the lost node dead after about 5 s (its health checks)
    cluster.restart_node(1)
    _wait_replica_on(two_nodes, 1)
    question, max_new = QUESTIONS[3], 160
    expected = tiny_runtime.complete("world_1", question, "cold", max_new).token_ids
    streamed, result, error = [], None, None
    with HeadstartClient(two_nodes.grpc_target, token=TOKEN) as client:
        session, before = _session_on(two_nodes, client, node=1)
        with session:
            for text in typed(question):
                session.input(text)
            session.wait_caught_up(60)
            session.send_submit(question, max_new)
            while not streamed:  # the answer has begun
                event = session.next_event(60)
                assert event.WhichOneof("kind") not in ("result", "error")
                if event.WhichOneof("kind") == "tokens":
                    streamed.append(event.tokens.text)
            assert two_nodes.cluster.kill_node(1)
            killed = time.monotonic()
            while result is None and error is None:  # TimeoutError here = a hang
                event = session.next_event(max(0.1, 120 - (time.monotonic() - killed)))
                kind = event.WhichOneof("kind")
                if kind == "tokens":
                    streamed.append(event.tokens.text)
                elif kind == "result":
                    result = event.result
                elif kind == "error":
                    error = event.error
    if result is not None:
        assert list(result.token_ids) == list(expected)
        assert "".join(streamed) == result.text  # resubmitted on the head's replica, no token twice
        assert result.replica != before.replica
    else:
        assert error.code == "UNAVAILABLE", error  # retryable: the client may submit again
