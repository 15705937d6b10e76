"""A Ray cluster of several nodes on one machine, for tests and fault runs.

Each node is a `ray start` of its own: its own raylet, object store, workers
and address. The head runs in this machine's network namespace; every other
node in a network namespace of its own (`ip netns`), joined to the head by a
veth pair on a private /24 behind a bridge, so a node has its own IP (Ray
keys nodes by address) and the node's processes are exactly those in its
namespace: `kill_node` SIGKILLs them all, as a machine that loses power, and
`restart_node` brings the node back.

Each node gets `NODE_RESOURCE_PREFIX + index` (one unit: place an actor on a
chosen node) and `REPLICA_SLOT` (`replica_slots` units: with one, replicas
asking for a slot land on different nodes). Ray's token auth is on (a fresh
token file, as `headstart serve` does); `client_env()` is what a driver
(`headstart serve --ray-address`) needs besides the address.

Needs root (namespaces, links) and iproute2; `netns_unavailable()` says why
not. Everything made is removed on `stop()`, also after a failed start.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.engine.loopback import BIND_HOST_ENV
from services.engine.ray_stack import LOCAL_ONLY_ENV
from services.engine.ray_auth import MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV
from services.private_dir import PrivateDir

NODE_RESOURCE_PREFIX = "headstart_node_"
REPLICA_SLOT = "headstart_replica_slot"
DIRECT_HOST_ENV = "HEADSTART_ENGINE_DIRECT_HOST"
START_TIMEOUT_S = 120.0


def netns_unavailable() -> str | None:
    """Why this machine cannot make network namespaces here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    name = f"hs-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@dataclass
class ClusterNode:
    """One Ray node: its index, address, namespace (None: the head, in this machine's) and `ray start`."""

    index: int
    ip: str
    netns: str | None
    process: subprocess.Popen | None = None
    killed: bool = False

    @property
    def resource(self) -> str:
        return f"{NODE_RESOURCE_PREFIX}{self.index}"


@dataclass
class LocalCluster:
    """`num_nodes` Ray nodes (node 0 the head) with `cpus_per_node` CPUs each; `start()`, then `stop()`."""

    num_nodes: int = 2
    cpus_per_node: float = 1
    replica_slots: int = 1
    object_store_mib: int = 128
    nodes: list[ClusterNode] = field(default_factory=list)
    gcs_port: int = 0
    _tag: str = ""
    _temp: Path | None = None
    _auth: PrivateDir | None = None
    _links: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        """The GCS address a driver passes to `ray.init(address=...)` / `--ray-address`."""
        return f"{self.nodes[0].ip}:{self.gcs_port}"

    @property
    def temp_dir(self) -> Path:
        if self._temp is None:
            raise RuntimeError("cluster not started")
        return self._temp

    def client_env(self) -> dict[str, str]:
        """Environment a driver or node of this cluster needs: Ray's token auth, and Ray's multi-node
        switch on (a process that ran a one-node stack before turned it off in its own environment,
        `keep_ray_on_loopback`, and `ray start --address` then refuses to join)."""
        return {MODE_ENV: "token", TOKEN_PATH_ENV: str(self._auth.path / "ray-auth-token"), LOCAL_ONLY_ENV: "1"}

    def start(self) -> LocalCluster:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1, got {self.num_nodes}")
        why = netns_unavailable() if self.num_nodes > 1 else None
        if why:
            raise RuntimeError(f"cannot start a multi-node local cluster: {why}")
        self._tag = f"{os.getpid() % 100000}{random.randrange(10)}"
        try:
            self._temp = Path(tempfile.mkdtemp(prefix=f"hsc{self._tag}-", dir="/tmp"))  # short: socket paths
            self._auth = PrivateDir("hs-cluster-auth-")
            self._auth.write("ray-auth-token", os.urandom(32).hex())
            subnet = self._free_subnet()
            hosts = list(subnet.hosts())
            self.nodes = [ClusterNode(i, str(hosts[i]), None if i == 0 else f"hs{self._tag}n{i}")
                          for i in range(self.num_nodes)]
            if self.num_nodes > 1:
                self._make_network(subnet.prefixlen)
            self.gcs_port = _free_port(self.nodes[0].ip)
            for node in self.nodes:
                self._start_node(node)
                self._wait_joined(len([n for n in self.nodes if n.process is not None]))
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def kill_node(self, index: int) -> list[int]:
        """SIGKILL every process of worker node `index` (its raylet, object store, agents, workers); returns
        their pids. The head is refused: it holds the cluster's GCS and Serve's controller."""
        if index == 0:
            raise ValueError("the head node holds the GCS; kill a worker node (index >= 1)")
        node = self.nodes[index]
        pids = _netns_pids(node.netns)
        for pid in pids:
            _kill(pid)
        node.killed = True
        return pids

    def restart_node(self, index: int) -> None:
        """Start killed worker node `index` again (a fresh `ray start` in its namespace, same address
        and resources) and wait until the cluster counts it alive."""
        node = self.nodes[index]
        if not node.killed:
            raise ValueError(f"node {index} is running")
        if node.process is not None:
            node.process.wait(timeout=30)
        self._start_node(node)
        node.killed = False
        self._wait_joined(len(self.nodes))

    def stop(self) -> None:
        """Kill every node's processes, remove the namespaces, links, token and temp files."""
        for node in reversed(self.nodes):
            if node.netns:
                for pid in _netns_pids(node.netns):
                    _kill(pid)
            elif node.process is not None:
                for pid in _tree(node.process.pid) + self._by_temp_dir():
                    _kill(pid)
            if node.process is not None:
                try:
                    node.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for node in self.nodes:
            if node.netns:
                subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
        for link in reversed(self._links):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        self._links.clear()
        if self._auth is not None:
            self._auth.cleanup()
            self._auth = None
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)

    # -- building ------------------------------------------------------------

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        for _ in range(100):
            net = ipaddress.ip_network(f"10.{random.randrange(200, 255)}.{random.randrange(256)}.0/24")
            if f" 10.{net.network_address.packed[1]}.{net.network_address.packed[2]}." not in used:
                return net
        raise RuntimeError("no free private /24 found")

    def _make_network(self, prefix: int) -> None:
        bridge = f"hsb{self._tag}"
        _ip("link", "add", bridge, "type", "bridge")
        self._links.append(bridge)
        _ip("addr", "add", f"{self.nodes[0].ip}/{prefix}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for node in self.nodes[1:]:
            outer, inner = f"hsv{self._tag}n{node.index}", f"hsi{self._tag}n{node.index}"
            _ip("netns", "add", node.netns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._links.append(outer)  # deleting one end deletes the pair
            _ip("link", "set", inner, "netns", node.netns)
            _ip("link", "set", outer, "master", bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.ip}/{prefix}", "dev", inner)
            _ip("-n", node.netns, "link", "set", inner, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")

    def _start_node(self, node: ClusterNode) -> None:
        resources = {node.resource: 1, REPLICA_SLOT: self.replica_slots}
        # NOTE: this interpreter, not the `ray` script on PATH or beside it (a copied virtualenv's
        # script names the interpreter it was made for): every node's workers run the driver's Python
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
               f"--node-ip-address={node.ip}", f"--num-cpus={self.cpus_per_node}",
               f"--resources={json.dumps(resources)}", f"--object-store-memory={self.object_store_mib << 20}",
               f"--temp-dir={self._temp}", f"--dashboard-agent-listen-port={_free_port(node.ip, node.netns)}"]
        if node.index == 0:
            cmd += ["--head", f"--port={self.gcs_port}", "--include-dashboard=false"]
        else:
            cmd = ["ip", "netns", "exec", node.netns, *cmd, f"--address={self.address}"]
        # The head's Serve servers stay on loopback (the driver and gateway run beside it); another
        # node's listen on its own address, which the head's proxy and the gateway dial.
        bind = "127.0.0.1" if node.index == 0 else node.ip
        env = {**os.environ, **self.client_env(), "RAY_USAGE_STATS_ENABLED": "0", BIND_HOST_ENV: bind,
               DIRECT_HOST_ENV: bind, "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
               "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}
        if node.index == 0:  # a lost node is declared dead after about 5 s (Ray's default: 15 s)
            env.update(RAY_health_check_period_ms="1000", RAY_health_check_timeout_ms="1000")
        env.pop(TOKEN_ENV, None)
        env.pop("RAY_ADDRESS", None)
        log = open(self._temp / f"node{node.index}.log", "ab")
        node.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _wait_joined(self, count: int) -> None:
        """Until the GCS lists `count` live nodes (a node that exits early fails at once)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    tail = (self._temp / f"node{node.index}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"ray node {node.index} exited ({node.process.returncode}):\n{tail}")
            if self.live_nodes() >= count:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{count} Ray nodes did not join within {START_TIMEOUT_S:.0f} s")

    def live_nodes(self) -> int:
        """How many nodes the GCS counts alive (asked from a child process: this one may hold another Ray)."""
        code = ("import sys\nfrom ray._raylet import GcsClient\n"
                "c = GcsClient(address=sys.argv[1])\n"
                "print(sum(1 for n in c.get_all_node_info(timeout=5).values() if n.state == 0))\n")
        env = {**os.environ, **self.client_env()}
        env.pop(TOKEN_ENV, None)
        got = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True, env=env,
                             timeout=60)
        try:
            return int(got.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def _by_temp_dir(self) -> list[int]:
        """Processes whose command line names this cluster's temp dir (Ray's, of the head)."""
        import psutil

        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(str(self._temp) in part for part in proc.info["cmdline"] or ()):
                    found.append(proc.info["pid"])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _free_port(host: str, netns: str | None = None) -> int:
    if netns is None:
        from services.engine.ray_stack import free_port

        return free_port(host)
    return random.randrange(20000, 30000)  # a fresh namespace has nothing listening


def _netns_pids(netns: str | None) -> list[int]:
    if not netns:
        return []
    got = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in got.stdout.split()]


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
