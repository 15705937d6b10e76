"""`headstart loadtest SCENARIO`: start the local stack (unless --host), run Locust headless, report.

Locust runs in a child process (`python -m locust -f scenarios/SCENARIO.py`):
gevent's monkey-patching must not reach Ray or the in-process gateway. What
the users need besides `--host` goes to them as environment variables
(`loadtest.settings`). Outputs under --out: Locust's CSV files
(`locust_stats.csv`, `locust_failures.csv`, ...: requests only, so its
"Aggregated" row adds answers, opens and pushes, never keystrokes) and
`locust.html`, every request and metric in `samples.jsonl`, and ours
(`loadtest.report`): `loadtest.json`, `loadtest.csv`, `loadtest.md` (per
user class: TTFT, ITL, the complete answer, output tokens/s, requests/s,
errors) and `loadtest.png`.

The local stack (`headstart serve`'s) runs the flash worker, which the data
users' flash answers need, with the run's answer length (`--max-new-tokens`,
the gateway's default too); against `--host` the deployment runs its own.
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
import ast
import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from loadtest.settings import DEFAULT_DBS, LoadSettings
from loadtest.timing import arrival_times, parse_length_sets

SCENARIO_DIR = Path(__file__).parent / "scenarios"
RUN_TIME = re.compile(r"^(\d+[hms]?)+$")
UNITS = {"h": 3600, "m": 60, "s": 1, "": 1}


def scenario_path(name: str) -> Path:
    """A scenario name (steady, burst, mixed, soak) or a locustfile path."""
    path = SCENARIO_DIR / f"{name}.py"
    if path.is_file() and not name.startswith("_"):
        return path
    if Path(name).is_file():
        return Path(name)
    known = sorted(p.stem for p in SCENARIO_DIR.glob("*.py") if not p.stem.startswith("_"))
    raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(known)} or a locustfile path")


def scenario_defaults(path: Path) -> dict:
    """The file's `SCENARIO = {...}` literal, read without importing it (it imports gevent)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SCENARIO" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def run_time_s(run_time: str) -> int:
    if not RUN_TIME.match(run_time):
        raise ValueError(f"bad --time {run_time!r}: use e.g. 60s, 2m, 1h30m")
    return sum(int(n) * UNITS[u] for n, u in re.findall(r"(\d+)([hms]?)", run_time))


def loadtest_cli(
    scenario: str = typer.Argument(..., help="steady | burst | mixed | soak, or a locustfile path"),
    out: Path = typer.Option(..., help="output folder (Locust CSVs with prefix OUT/locust, HTML, our table, plot)"),
    host: Optional[str] = typer.Option(None, help="gateway HTTP URL to load (default: start the local stack)"),
    grpc_target: Optional[str] = typer.Option(None, help="gateway gRPC host:port (default: --host's host, port 50051)"),
    model: str = typer.Option(DEFAULT_MODEL, help="model of the local stack (when no --host)"),
    dtype: str = typer.Option("float32", help="serving dtype of the local stack (float64: no near-ties, for "
                                              "comparing answers with cold runs on random weights)"),
    users: Optional[int] = typer.Option(None, help="concurrent users (default: the scenario's)"),
    spawn_rate: Optional[float] = typer.Option(None, help="users started per second (default: the scenario's)"),
    time_limit: Optional[str] = typer.Option(None, "--time", help="run time, e.g. 60s, 2m (default: the scenario's)"),
    replicas: int = typer.Option(1, help="engine replicas of the local stack"),
    max_sessions: Optional[int] = typer.Option(None, help="sessions per replica (default: the scenario's)"),
    tenants: int = typer.Option(3, help="tenants of the local stack (one bearer token each)"),
    token: list[str] = typer.Option([], help="bearer token(s) for --host (repeat: users take them in turn)"),
    db: list[str] = typer.Option(list(DEFAULT_DBS), help="Spider databases (users take them in turn)"),
    max_new_tokens: int = typer.Option(16, help="answer tokens per submit / completion"),
    wpm: float = typer.Option(60.0, help="typist speed (words per minute)"),
    seed: int = typer.Option(0),
    timeout: float = typer.Option(120.0, help="a request with no answer after this many seconds fails (timeout)"),
    warmup: bool = typer.Option(True, help="before the clock starts, open one session per database (builds its P0)"),
    data_db: str = typer.Option("world_1", help="database of the data users' sessions (a SQLite one)"),
    data_rows_per_push: int = typer.Option(5, help="rows in one push of a data user"),
    data_push_interval: float = typer.Option(1.0, help="seconds between a data producer's pushes"),
    flash_push_interval: float = typer.Option(5.0, help="seconds between a flash subscriber's pushes"),
    faults: list[str] = typer.Option([], help="faults injected mid-run (local stack only): redis-restart = the "
                                              "stack's Redis killed halfway through, down --fault-down-s, restarted; "
                                              "node-kill = the stack on two Ray nodes (needs root: network "
                                              "namespaces), one replica each, the worker node SIGKILLed halfway "
                                              "through; the run then fails on any lost acknowledged row or untyped "
                                              "error (node-kill: or a lost session, or an answer unlike a cold run's)"),
    fault_down_s: float = typer.Option(5.0, help="how long a redis-restart keeps Redis down"),
    rate: float = typer.Option(1.0, help="open loop (scenario `open`): requests arriving per second"),
    arrival: str = typer.Option("poisson", help="open loop: fixed (every 1/rate s) or poisson"),
    lengths: list[str] = typer.Option(["32:16"], help="open loop: IN:OUT question:answer tokens (repeat; in turn)"),
    max_in_flight: int = typer.Option(256, help="open loop: requests at once; an arrival past it fails"),
):
    """Run a Locust load-test scenario headless and write its CSVs, HTML report, TTFT table and plot."""
    try:
        path = scenario_path(scenario)
        defaults = scenario_defaults(path)
        run_time = time_limit or defaults.get("run_time", "60s")
        seconds = run_time_s(run_time)
        _check_faults(faults, host)
        next(arrival_times(rate, arrival))  # a generator: checks its arguments at the first arrival
        parse_length_sets(list(lengths))
    except (ValueError, SyntaxError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    n_users = users or defaults.get("users", 8)
    spawn = spawn_rate or defaults.get("spawn_rate", max(1, n_users // 4))
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.jsonl").unlink(missing_ok=True)
    settings = LoadSettings(tokens=list(token), dbs=list(db), max_new_tokens=max_new_tokens, wpm=wpm, seed=seed,
                            timeout_s=timeout, samples_path=str((out / "samples.jsonl").resolve()), data_db=data_db,
                            data_rows_per_push=data_rows_per_push, data_push_interval_s=data_push_interval,
                            flash_push_interval_s=flash_push_interval, rate=rate, arrival=arrival,
                            length_sets=list(lengths), max_in_flight=max_in_flight,
                            acked_path=str((out / "acked.jsonl").resolve()) if faults else "",
                            answers_path=str((out / "answers.jsonl").resolve()) if faults else "")
    (out / "acked.jsonl").unlink(missing_ok=True)
    (out / "answers.jsonl").unlink(missing_ok=True)
    meta = {"scenario": path.stem, "users": n_users, "spawn_rate": spawn, "run_time": run_time, "seed": seed,
            "max_new_tokens": max_new_tokens, "dbs": "+".join(db)}
    if path.stem == "open":
        meta.update(rate=rate, arrival=arrival, lengths=",".join(lengths))
    stack = sampler = cluster = on_cluster = None
    cluster_exit = contextlib.ExitStack()
    try:
        if host is None:
            if "node-kill" in faults:
                replicas = max(2, replicas)
                cluster, on_cluster = _start_cluster(replicas, cluster_exit)
                meta.update(ray_nodes=len(cluster.nodes))
            stack, sampler = _start_local(settings, model, replicas, tenants,
                                          max_sessions or defaults.get("max_sessions", 64), seconds, dtype, on_cluster)
            meta.update(flash_max_new_tokens=settings.max_new_tokens)
            host, settings.grpc_target = stack.http_url, stack.grpc_target
            meta.update(model=model, dtype=dtype, replicas=replicas, tenants=tenants,
                        max_sessions=max_sessions or defaults.get("max_sessions", 64))
        else:
            settings.grpc_target = grpc_target or f"{re.sub(r'^[a-z]+://', '', host).split('/')[0].split(':')[0]}:50051"
            meta.update(host=host, tenants=len(token))
        if warmup:
            _warm_up(settings)
        injected = [_start_fault(name, stack, seconds / 2, fault_down_s, cluster) for name in faults]
        rc = locust_rc = _run_locust(path, host, settings, n_users, spawn, run_time, seconds, out)
        if injected:
            meta["faults"], rc = _fault_verdict(injected, stack, settings, out)
    finally:
        memory = sampler.stop() if sampler else None
        if stack is not None:
            stack.stop()
        cluster_exit.close()
    from loadtest.memory import memory_trend
    from loadtest.report import write_report

    meta["locust_exit_code"] = locust_rc
    typer.echo(write_report(out, meta, memory, memory_trend(memory) if memory else None))
    typer.echo(f"wrote {out}/locust_stats.csv, locust.html, loadtest.json, loadtest.md, loadtest.png")
    raise typer.Exit(rc)


def _check_faults(faults: list[str], host: str | None) -> None:
    from loadtest.faults import FAULTS

    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; valid: {', '.join(FAULTS)}")
    if faults and host is not None:
        raise ValueError("--faults needs the local stack (it restarts the stack's own Redis): drop --host")
    if "node-kill" in faults and "redis-restart" in faults:
        raise ValueError("--faults node-kill and redis-restart: one at a time (node-kill's Redis is not embedded)")
    if "node-kill" in faults:
        from services.local_cluster import netns_unavailable

        why = netns_unavailable()
        if why:
            raise ValueError(f"--faults node-kill runs the stack on two Ray nodes in network namespaces: {why}")


def _start_fault(name: str, stack, at_s: float, down_s: float, cluster=None):
    from loadtest.faults import RedisRestart
    from loadtest.node_kill import NodeKill

    if name == "node-kill":
        return NodeKill(cluster, at_s, say=typer.echo).start()
    return RedisRestart(stack, at_s, down_s, say=typer.echo).start()


def _start_cluster(nodes: int, cluster_exit: contextlib.ExitStack):
    """`nodes` Ray nodes on this machine, one replica slot each, and a Redis on the head's address
    (every node dials it), both stopped by `cluster_exit`; this process becomes a client of the
    cluster (its token auth). Returns (the cluster, serve_command's arguments to run on it)."""
    from headstart.redis_server import local_redis
    from services.local_cluster import REPLICA_SLOT, LocalCluster

    typer.echo(f"starting a local Ray cluster of {nodes} nodes (network namespaces) ...")
    cluster = cluster_exit.enter_context(LocalCluster(num_nodes=nodes, cpus_per_node=1))
    os.environ.update(cluster.client_env())
    # NOTE: Redis's protected mode refuses clients from a non-loopback address when it has no password;
    # the bridge's /24 reaches only this machine and its namespaces, as loopback does
    redis = cluster_exit.enter_context(local_redis(host=cluster.nodes[0].ip, aof=True,
                                                   extra_args=("--protected-mode", "no")))
    typer.echo(f"Ray cluster up at {cluster.address}: nodes " + ", ".join(n.ip for n in cluster.nodes))
    return cluster, {"ray_address": cluster.address, "replica_resource": REPLICA_SLOT, "redis_url": redis.url}


def _fault_verdict(injected: list, stack, settings: LoadSettings, out: Path) -> tuple[dict, int]:
    """What the faults cost: lost acknowledged rows and untyped errors; the exit code fails the run on
    either (Locust's own fails it on any failed request, and typed errors are what a fault must give)."""
    from loadtest.faults import acked_rows, check_acked, typed_errors
    from loadtest.report import load_samples

    for fault in injected:
        fault.wait()
    tenants = {token: f"tenant{i}" for i, token in enumerate(settings.tokens)}  # as _start_local named them
    rows = check_acked(stack.http_url, stack.redis_url, tenants, acked_rows(out / "acked.jsonl"))
    errors = typed_errors(load_samples(out / "samples.jsonl"))
    verdict = {"injected": [f.record for f in injected], "acked": rows, "errors": errors}
    ok = all(f.record.get("restarted", f.record.get("killed")) for f in injected) and rows["lost_rows"] == 0 \
        and not rows["sessions_behind"] and errors["untyped"] == 0
    kill = next((f.record for f in injected if f.record["kind"] == "node-kill"), None)
    if kill is not None:
        from loadtest.node_kill import answer_records, check_sessions

        sessions = check_sessions(settings.grpc_target, answer_records(out / "answers.jsonl"), kill.get("killed_t"),
                                  settings.max_new_tokens)
        verdict["sessions"] = sessions
        ok = ok and sessions["lost"] == 0 and sessions["identical"] == sessions["answered"] \
            and not sessions.get("cold_errors")
        typer.echo(f"node-kill: {sessions['through_kill']} sessions open at the kill ({sessions['killed_mid_typing']} "
                   f"mid-typing, {sessions['killed_mid_answer']} mid-answer): {sessions['continued']} continued, "
                   f"{sessions['lost']} lost {sessions['lost_codes']}; answers identical to a cold run: "
                   f"{sessions['identical']} of {sessions['answered']} ({sessions['identical_through_kill']} of "
                   f"{sessions['answered_through_kill']} through the kill)")
    typer.echo(f"faults: {rows['lost_rows']} of {rows['acked_rows']} acknowledged rows lost "
               f"({rows['sessions']} sessions); {errors['errors']} failed requests, {errors['untyped']} untyped "
               f"{errors['by_code']}: {'PASS' if ok else 'FAIL'}")
    return verdict, 0 if ok else 1


def _start_local(settings: LoadSettings, model: str, replicas: int, tenants: int, max_sessions: int, seconds: int,
                 dtype: str = "float32", on_cluster: dict | None = None):
    from loadtest.memory import MemorySampler
    from services.launcher import serve_command

    specs = [f"tenant{i}=loadtest-token-{i}" for i in range(tenants)]
    settings.tokens = [s.split("=", 1)[1] for s in specs]
    # Flash answers as long as every other answer of the run: with random weights no answer
    # stops early, and the gateway's default (128) made each data version's flash answer
    # take 80 of 124 s of the 0.5B replica in a mixed run (issue 14).
    stack = serve_command(model=model, dtype=dtype, port=0, grpc_port=0, replicas=replicas, tokens=specs,
                          max_sessions=max_sessions, default_max_new_tokens=settings.max_new_tokens, block=False,
                          say=typer.echo, **(on_cluster or {}))
    long_run = seconds >= 600
    return stack, MemorySampler(period_s=10.0 if long_run else 2.0, probe=_replica_probe(),
                                probe_period_s=60.0 if long_run else 10.0).start()


def _replica_probe():
    """A call of a replica's `memory_probe` through a Serve handle (this process is the Ray driver)."""
    from ray import serve

    from services.engine.deployment import APP_NAME

    handle = serve.get_app_handle(APP_NAME)
    return lambda: handle.memory_probe.remote(detail=True).result(timeout_s=60)


def _warm_up(settings: LoadSettings) -> None:
    """Build each database's P0 before the clock starts: the first session of a
    database prefills its whole schema (tens of seconds for a 0.5B model on a
    busy CPU), which is start-up, not the load being measured."""
    from headstart.client import HeadstartClient

    token = settings.tokens[0] if settings.tokens else None
    with HeadstartClient(settings.grpc_target, token, timeout_s=900) as client:
        for db in settings.dbs:
            started = time.perf_counter()
            with client.typing(db) as session:
                session.input("How many")
                session.wait_caught_up(900)
            typer.echo(f"warm-up: {db} ready in {time.perf_counter() - started:.1f} s")


def _child_env() -> dict[str, str]:
    """This environment with the checkout's root on PYTHONPATH (`loadtest`, `services` import from it)."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def _run_locust(path: Path, host: str, settings: LoadSettings, users: int, rate: float, run_time: str,
                seconds: int, out: Path) -> int:
    env = {**_child_env(), **settings.to_env()}
    cmd = [sys.executable, "-m", "locust", "-f", str(path), "--headless", "--users", str(users),
           "--spawn-rate", str(rate), "--run-time", run_time, "--host", host, "--csv", str(out / "locust"),
           "--html", str(out / "locust.html"), "--stop-timeout", "20", "--only-summary", "--loglevel", "WARNING"]
    typer.echo(f"locust: {users} users of {path.stem} for {run_time} against {host} (gRPC {settings.grpc_target})")
    try:
        return subprocess.run(cmd, env=env, timeout=seconds + 180).returncode
    except subprocess.TimeoutExpired:
        typer.secho("error: Locust did not stop in time", fg=typer.colors.RED, err=True)
        return 124
